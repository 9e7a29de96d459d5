package devforge

import (
	"regexp"
	"strings"
)

// Placeholders NormalizeLog puts where runs legitimately differ.
const (
	normRunner   = "<runner>"
	normVersion  = "<version>"
	normID       = "<id>"
	normSHA      = "<sha>"
	normUUID     = "<uuid>"
	normWorkdir  = "<workdir>"
	normTmp      = "<tmp>"
	normDuration = "<duration>"
)

var (
	// Gitea serves every row as "<RFC 3339 time with 7 fraction digits>Z <content>".
	reTimestamp = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?(?: |$)`)
	// The runner's first row: "<name>(version:<v>) received task <id> of job <job>, be triggered by event: <e>".
	reReceived = regexp.MustCompile(`^.*\(version:[^)]*\) received task \d+ of job `)
	reUUID     = regexp.MustCompile(`\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`)
	// Commit SHAs (40 hex, sha1; 64 hex, sha256). Shorter abbreviations are left alone: too
	// easily a real value.
	reSHA = regexp.MustCompile(`\b(?:[0-9a-f]{64}|[0-9a-f]{40})\b`)
	// Host-mode job directories: <host.workdir_parent>/<16 random hex>/{hostexecutor,act,tmp}
	// and <host.workdir_parent>/tool_cache.
	reHostWorkdir = regexp.MustCompile(`(?:/[^\s/'"=:]+)*/[0-9a-f]{16}/(hostexecutor|act|tmp)\b`)
	reToolCache   = regexp.MustCompile(`(?:/[^\s/'"=:]+)+/tool_cache\b`)
	// Anything else under a temporary directory (t.TempDir(), mktemp), where a path starts.
	reTmpPath = regexp.MustCompile(`(^|[\s'"=:(\[])(?:/var)?/tmp(?:/[^\s/'"=:]+)+`)
	// Run, job and task ids in Gitea URLs and runner messages.
	reRunURL   = regexp.MustCompile(`/actions/(runs|jobs|tasks)/\d+`)
	reJobURL   = regexp.MustCompile(`/jobs/\d+`)
	reTaskWord = regexp.MustCompile(`\b(task|Task) \d+\b`)
	reTaskName = regexp.MustCompile(`\bGITEA-ACTIONS-TASK-\d+`)
	// Go-style durations and the bracketed step timings act prints: 1.234s, 15ms, 1m2.5s, 3µs.
	reDuration = regexp.MustCompile(`\b(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|h|m|s))+\b`)
)

// NormalizeLog rewrites a job log (as [Forge.JobLog] returns it) so that two runs of the same
// job on different runners compare equal: it removes the timestamp at the start of every line
// and replaces what legitimately differs with placeholders (runner name and version in the
// runner's first line, run/job/task ids, commit SHAs, UUIDs, host-mode work directories,
// temporary paths, durations). It also drops trailing whitespace and trailing empty lines (the
// runner may end a log with an empty row). Everything else — step names, commands, output,
// masked secrets, the final result — is kept, so a difference there is a real one.
func NormalizeLog(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	lines := strings.Split(s, "\n")
	for i, line := range lines {
		lines[i] = normalizeLine(line)
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

func normalizeLine(line string) string {
	line = reTimestamp.ReplaceAllLiteralString(line, "")
	line = reReceived.ReplaceAllLiteralString(line,
		normRunner+"(version:"+normVersion+") received task "+normID+" of job ")
	line = reUUID.ReplaceAllLiteralString(line, normUUID)
	line = reSHA.ReplaceAllLiteralString(line, normSHA)
	line = reHostWorkdir.ReplaceAllString(line, normWorkdir+"/$1")
	line = reToolCache.ReplaceAllLiteralString(line, normWorkdir+"/tool_cache")
	line = reTmpPath.ReplaceAllString(line, "${1}"+normTmp)
	line = reRunURL.ReplaceAllString(line, "/actions/$1/"+normID)
	line = reJobURL.ReplaceAllLiteralString(line, "/jobs/"+normID)
	line = reTaskWord.ReplaceAllString(line, "$1 "+normID)
	line = reTaskName.ReplaceAllLiteralString(line, "GITEA-ACTIONS-TASK-"+normID)
	line = reDuration.ReplaceAllLiteralString(line, normDuration)
	return strings.TrimRight(line, " \t")
}
