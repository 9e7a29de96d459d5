package spiretest

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Entry is a registration entry of the server.
type Entry struct {
	// ID is the server's ID of the entry.
	ID       string
	SPIFFEID spiffeid.ID
	ParentID spiffeid.ID
	// Selectors are "type:value", as in "unix:uid:1000" or "docker:label:app:web".
	Selectors []string
}

// jsonEntry is an entry as spire-server's command line prints it with -output json (the
// protojson form of spire.api.types.Entry, with the proto field names).
type jsonEntry struct {
	ID        string     `json:"id"`
	SPIFFEID  jsonSPIFFE `json:"spiffe_id"`
	ParentID  jsonSPIFFE `json:"parent_id"`
	Selectors []struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	} `json:"selectors"`
}

type jsonSPIFFE struct {
	TrustDomain string `json:"trust_domain"`
	Path        string `json:"path"`
}

func (j jsonSPIFFE) id() (spiffeid.ID, error) {
	td, err := spiffeid.TrustDomainFromString(j.TrustDomain)
	if err != nil {
		return spiffeid.ID{}, err
	}
	return spiffeid.FromPath(td, j.Path)
}

func (j jsonEntry) entry() (Entry, error) {
	id, err := j.SPIFFEID.id()
	if err != nil {
		return Entry{}, fmt.Errorf("entry %s: spiffe_id: %w", j.ID, err)
	}
	parent, err := j.ParentID.id()
	if err != nil {
		return Entry{}, fmt.Errorf("entry %s: parent_id: %w", j.ID, err)
	}
	e := Entry{ID: j.ID, SPIFFEID: id, ParentID: parent}
	for _, sel := range j.Selectors {
		e.Selectors = append(e.Selectors, sel.Type+":"+sel.Value)
	}
	return e, nil
}

// jsonStatus is the per-entry status of a batch call.
type jsonStatus struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// CreateEntry registers a workload entry (spire-server entry create) and returns it; each
// selector is "type:value". Workloads the agent attests to have all the selectors get
// spiffeID once the agent has synced (within CacheReloadInterval plus SyncInterval, give or
// take the SVID's signing).
func (s *SPIRE) CreateEntry(t *testing.T, spiffeID, parentID string, selectors ...string) Entry {
	t.Helper()
	args := []string{"entry", "create", "-socketPath", s.ServerSocket, "-output", "json",
		"-spiffeID", spiffeID, "-parentID", parentID}
	for _, sel := range selectors {
		args = append(args, "-selector", sel)
	}
	out, err := s.run(t.Context(), cliTimeout, s.serverBin, args...)
	if err != nil {
		t.Fatalf("spiretest: %v", err)
	}
	var resp struct {
		Results []struct {
			Status jsonStatus `json:"status"`
			Entry  jsonEntry  `json:"entry"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("spiretest: entry create: decode %q: %v", out, err)
	}
	if len(resp.Results) != 1 || resp.Results[0].Status.Code != 0 {
		t.Fatalf("spiretest: entry create %s: %s", spiffeID, out)
	}
	e, err := resp.Results[0].Entry.entry()
	if err != nil {
		t.Fatalf("spiretest: entry create: %v", err)
	}
	return e
}

// DeleteEntry deletes the entry with the server's ID id (spire-server entry delete).
func (s *SPIRE) DeleteEntry(t *testing.T, id string) {
	t.Helper()
	out, err := s.run(t.Context(), cliTimeout, s.serverBin, "entry", "delete", "-socketPath", s.ServerSocket,
		"-output", "json", "-entryID", id)
	if err != nil {
		t.Fatalf("spiretest: %v", err)
	}
	var resp struct {
		Results []struct {
			Status jsonStatus `json:"status"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("spiretest: entry delete: decode %q: %v", out, err)
	}
	if len(resp.Results) != 1 || resp.Results[0].Status.Code != 0 {
		t.Fatalf("spiretest: entry delete %s: %s", id, out)
	}
}

// Entries lists the server's registration entries (spire-server entry show), ordered as the
// command line orders them.
func (s *SPIRE) Entries(t *testing.T) []Entry {
	t.Helper()
	out, err := s.run(t.Context(), cliTimeout, s.serverBin, "entry", "show", "-socketPath", s.ServerSocket, "-output", "json")
	if err != nil {
		t.Fatalf("spiretest: %v", err)
	}
	var resp struct {
		Entries []jsonEntry `json:"entries"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("spiretest: entry show: decode %q: %v", out, err)
	}
	entries := make([]Entry, 0, len(resp.Entries))
	for _, j := range resp.Entries {
		e, err := j.entry()
		if err != nil {
			t.Fatalf("spiretest: entry show: %v", err)
		}
		entries = append(entries, e)
	}
	return entries
}
