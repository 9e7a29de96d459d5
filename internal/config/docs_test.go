package config

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/dynrunner/dynrunner/executor"
)

const configurationDoc = "../../docs/configuration.md"

// docTable is one section's variable table: the cells of each row by variable name.
type docTable map[string][]string

// parseDocTables reads the Markdown tables of configurationDoc under each "## " heading and
// returns the rows whose first cell is a variable name in backticks.
func parseDocTables(t *testing.T) map[string]docTable {
	t.Helper()
	data, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatalf("read the configuration reference: %v", err)
	}
	tables := map[string]docTable{}
	section := ""
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = strings.TrimSpace(h)
			continue
		}
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		name, ok := strings.CutPrefix(cells[0], "`")
		if !ok {
			continue // the header or the separator row
		}
		name = strings.TrimSuffix(name, "`")
		if tables[section] == nil {
			tables[section] = docTable{}
		}
		if _, dup := tables[section][name]; dup {
			t.Errorf("%s, section %q: %s has two rows", configurationDoc, section, name)
		}
		tables[section][name] = cells
	}
	return tables
}

// TestDocsListEveryVariable keeps docs/configuration.md in step with ControllerVars and
// ExecutorVars: every variable has a row in its section, the Default column shows its
// default in backticks (or "—" when it has none), and no row names a variable the code does
// not know.
func TestDocsListEveryVariable(t *testing.T) {
	tables := parseDocTables(t)
	for _, tc := range []struct {
		section string
		vars    []Var
	}{
		{"Controller variables", ControllerVars},
		{"Executor variables", ExecutorVars},
		{"Identity registrar variables", IdentityVars},
	} {
		t.Run(tc.section, func(t *testing.T) {
			rows, ok := tables[tc.section]
			if !ok {
				t.Fatalf("%s has no table under the heading %q", configurationDoc, "## "+tc.section)
			}
			known := map[string]bool{}
			for _, v := range tc.vars {
				known[v.Name] = true
				row, ok := rows[v.Name]
				if !ok {
					t.Errorf("%s is not documented in %s, section %q", v.Name, configurationDoc, tc.section)
					continue
				}
				if len(row) < 3 {
					t.Errorf("%s: row has %d columns, want Variable | Default | Meaning", v.Name, len(row))
					continue
				}
				if row[2] == "" {
					t.Errorf("%s: the Meaning column is empty", v.Name)
				}
				got := row[1]
				if v.Default == "" {
					if got != "—" {
						t.Errorf("%s has no default, but its row shows %q; want \"—\"", v.Name, got)
					}
					continue
				}
				if want := "`" + v.Default + "`"; !strings.Contains(got, want) {
					t.Errorf("%s: the Default column shows %q, want %s", v.Name, got, want)
				}
			}
			for name := range rows {
				if !known[name] {
					t.Errorf("%s, section %q, documents %s, which the code does not define", configurationDoc, tc.section, name)
				}
			}
		})
	}
}

// TestExecutorVarsAreTheContract: ExecutorVars documents every variable of the executor
// contract (executor.Config.Environ) and no other.
func TestExecutorVarsAreTheContract(t *testing.T) {
	c := executor.Config{Task: 1, Epoch: 1, SecretsDir: "/s", WorkDir: "/w", ForgeURL: "https://forge.test"}
	var names []string
	for _, v := range ExecutorVars {
		names = append(names, v.Name)
	}
	assert.ElementsMatch(t, slices.Collect(maps.Keys(c.Environ())), names)
}
