package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// devIdentity issues local environments their SVID files from the development CA.
type devIdentity struct{ ca *workload.DevCA }

// Files issues the environment's SVID, valid until notAfter: the end of the assignment's
// lease. The pod worker issues it again with every renewal of the lease (podworker.Refresher),
// so an SVID never outlives the lease it was issued under.
func (d devIdentity) Files(task assignment.TaskID, epoch assignment.Epoch, notAfter time.Time) (map[string][]byte, error) {
	ttl := time.Until(notAfter)
	if ttl <= 0 {
		return nil, fmt.Errorf("the lease of task %d ended at %s: no SVID for it", task, notAfter.UTC().Format(time.RFC3339))
	}
	svid, err := d.ca.Issue(workload.AssignmentID(d.ca.TrustDomain(), task, epoch), ttl)
	if err != nil {
		return nil, err
	}
	cert, key, err := svid.Marshal()
	if err != nil {
		return nil, fmt.Errorf("marshal SVID: %w", err)
	}
	bundle, err := d.ca.Bundle().Marshal()
	if err != nil {
		return nil, fmt.Errorf("marshal bundle: %w", err)
	}
	return map[string][]byte{workload.SVIDFile: cert, workload.SVIDKeyFile: key, workload.BundleFile: bundle}, nil
}

// facadeHosts are the DNS names and addresses the development facade certificate names, so a
// client dialling any facade of RUNNER_FACADE_URL (a comma-separated list) can verify it.
func facadeHosts(facadeURL string) []string {
	hosts := workload.LocalHosts()
	for raw := range strings.SplitSeq(facadeURL, ",") {
		if u, err := url.Parse(strings.TrimSpace(raw)); err == nil {
			if h := u.Hostname(); h != "" {
				hosts = append(hosts, h)
			}
		}
	}
	return hosts
}

func deriveKey(key []byte, label string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	return m.Sum(nil)
}
