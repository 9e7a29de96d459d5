package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net/url"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// devIdentity issues local environments their SVID files from the development CA.
type devIdentity struct{ ca *workload.DevCA }

// devSVIDTTL bounds the life of a local environment's SVID; the files are not rotated, so it
// covers the longest job (the runner's own timeout is 6h).
const devSVIDTTL = 8 * time.Hour

func (d devIdentity) Files(task assignment.TaskID, epoch assignment.Epoch) (map[string][]byte, error) {
	svid, err := d.ca.Issue(workload.AssignmentID(d.ca.TrustDomain(), task, epoch), devSVIDTTL)
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
// client dialling RUNNER_FACADE_URL can verify it.
func facadeHosts(facadeURL string) []string {
	hosts := workload.LocalHosts()
	if u, err := url.Parse(facadeURL); err == nil {
		if h := u.Hostname(); h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

func deriveKey(key []byte, label string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	return m.Sum(nil)
}
