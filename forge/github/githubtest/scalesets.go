package githubtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

type runnerGroup struct {
	ID        int
	Name      string
	IsDefault bool
}

type scaleSet struct {
	id       int
	name     string
	groupID  int
	labels   []wireLabel
	setting  wireRunnerSetting
	created  time.Time
	messages []*message
	nextMsg  int
}

// ScaleSet is a snapshot of one runner scale set.
type ScaleSet struct {
	ID            int
	Name          string
	RunnerGroupID int
	Labels        []string
}

// ScaleSets returns the scale sets that exist, by id.
func (s *Server) ScaleSets() []ScaleSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ScaleSet
	for id := 1; id < s.nextSetID; id++ {
		if set, ok := s.scaleSets[id]; ok {
			out = append(out, ScaleSet{ID: set.id, Name: set.name, RunnerGroupID: set.groupID, Labels: set.labelNames()})
		}
	}
	return out
}

func (set *scaleSet) labelNames() []string {
	names := make([]string, len(set.labels))
	for i, l := range set.labels {
		names[i] = l.Name
	}
	return names
}

// hasLabels reports whether set carries every one of labels, ignoring case.
func (set *scaleSet) hasLabels(labels []string) bool {
	for _, want := range labels {
		found := false
		for _, l := range set.labels {
			if strings.EqualFold(l.Name, want) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func (s *Server) groupLocked(id int) (runnerGroup, bool) {
	for _, g := range s.groups {
		if g.ID == id {
			return g, true
		}
	}
	return runnerGroup{}, false
}

// wireLocked renders set with its current statistics; s.mu must be held.
func (s *Server) wireLocked(set *scaleSet) *wireScaleSet {
	g, _ := s.groupLocked(set.groupID)
	return &wireScaleSet{
		ID:                 set.id,
		Name:               set.name,
		RunnerGroupID:      set.groupID,
		RunnerGroupName:    g.Name,
		Labels:             append([]wireLabel(nil), set.labels...),
		RunnerSetting:      set.setting,
		CreatedOn:          set.created,
		RunnerJitConfigURL: fmt.Sprintf("%s_apis/runtime/runnerscalesets/%d/generatejitconfig", s.ActionsServiceURL(), set.id),
		Statistics:         s.statisticsLocked(set.id),
	}
}

// scaleSetFromPath finds the scale set named by the {id} path value, answering 404 if none.
func (s *Server) scaleSetFromPath(w http.ResponseWriter, r *http.Request) (*scaleSet, bool) {
	id, err := strconv.Atoi(r.PathValue("id"))
	set, ok := s.scaleSets[id]
	if err != nil || !ok {
		writeException(w, http.StatusNotFound, "RunnerScaleSetNotFoundException", "githubtest: no runner scale set "+r.PathValue("id"))
		return nil, false
	}
	return set, true
}

// handleGetRunnerGroup is GET _apis/runtime/runnergroups/?groupName=.
func (s *Server) handleGetRunnerGroup(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("groupName")
	s.mu.Lock()
	defer s.mu.Unlock()
	list := wireList[wireRunnerGroup]{Value: []wireRunnerGroup{}}
	for _, g := range s.groups {
		if name == "" || strings.EqualFold(g.Name, name) {
			list.Value = append(list.Value, wireRunnerGroup{ID: g.ID, Name: g.Name, IsDefault: g.IsDefault})
		}
	}
	list.Count = len(list.Value)
	writeJSON(w, http.StatusOK, list)
}

// handleListScaleSets is GET _apis/runtime/runnerscalesets?runnerGroupId=&name=.
func (s *Server) handleListScaleSets(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("name")
	group, _ := strconv.Atoi(q.Get("runnerGroupId"))
	s.mu.Lock()
	defer s.mu.Unlock()
	list := wireList[*wireScaleSet]{Value: []*wireScaleSet{}}
	for id := 1; id < s.nextSetID; id++ {
		set, ok := s.scaleSets[id]
		if !ok || (name != "" && !strings.EqualFold(set.name, name)) || (group != 0 && set.groupID != group) {
			continue
		}
		list.Value = append(list.Value, s.wireLocked(set))
	}
	list.Count = len(list.Value)
	writeJSON(w, http.StatusOK, list)
}

// handleGetScaleSet is GET _apis/runtime/runnerscalesets/{id}.
func (s *Server) handleGetScaleSet(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, ok := s.scaleSetFromPath(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, s.wireLocked(set))
}

// handleCreateScaleSet is POST _apis/runtime/runnerscalesets.
func (s *Server) handleCreateScaleSet(w http.ResponseWriter, r *http.Request) {
	var in wireScaleSet
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: decode runner scale set: "+err.Error())
		return
	}
	if in.Name == "" || len(in.Labels) == 0 {
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: a runner scale set needs a name and at least one label")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.RunnerGroupID == 0 {
		in.RunnerGroupID = 1
	}
	if _, ok := s.groupLocked(in.RunnerGroupID); !ok {
		writeException(w, http.StatusBadRequest, "RunnerGroupNotFoundException", fmt.Sprintf("githubtest: no runner group %d", in.RunnerGroupID))
		return
	}
	for _, set := range s.scaleSets {
		if set.groupID == in.RunnerGroupID && strings.EqualFold(set.name, in.Name) {
			writeException(w, http.StatusConflict, "RunnerScaleSetExistsException", fmt.Sprintf("githubtest: runner scale set %q exists in group %d; get it by name instead", in.Name, in.RunnerGroupID))
			return
		}
	}
	set := &scaleSet{
		id:      s.nextSetID,
		name:    in.Name,
		groupID: in.RunnerGroupID,
		labels:  in.Labels,
		setting: in.RunnerSetting,
		created: time.Now().UTC(),
		nextMsg: 1,
	}
	s.nextSetID++
	s.scaleSets[set.id] = set
	writeJSON(w, http.StatusOK, s.wireLocked(set))
}

// handleUpdateScaleSet is PATCH _apis/runtime/runnerscalesets/{id}: fields present replace.
func (s *Server) handleUpdateScaleSet(w http.ResponseWriter, r *http.Request) {
	var in wireScaleSet
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: decode runner scale set: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	set, ok := s.scaleSetFromPath(w, r)
	if !ok {
		return
	}
	if in.Name != "" {
		set.name = in.Name
	}
	if in.RunnerGroupID != 0 {
		if _, ok := s.groupLocked(in.RunnerGroupID); !ok {
			writeException(w, http.StatusBadRequest, "RunnerGroupNotFoundException", fmt.Sprintf("githubtest: no runner group %d", in.RunnerGroupID))
			return
		}
		set.groupID = in.RunnerGroupID
	}
	if len(in.Labels) > 0 {
		set.labels = in.Labels
	}
	set.setting = in.RunnerSetting
	writeJSON(w, http.StatusOK, s.wireLocked(set))
}

// handleDeleteScaleSet is DELETE _apis/runtime/runnerscalesets/{id}: it takes the scale set's
// session and runners with it.
func (s *Server) handleDeleteScaleSet(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, ok := s.scaleSetFromPath(w, r)
	if !ok {
		return
	}
	delete(s.scaleSets, set.id)
	for id, sess := range s.sessions {
		if sess.scaleSetID == set.id {
			delete(s.sessions, id)
		}
	}
	for id, rn := range s.runners {
		if rn.scaleSetID == set.id {
			delete(s.runners, id)
		}
	}
	s.notifyLocked()
	w.WriteHeader(http.StatusNoContent)
}
