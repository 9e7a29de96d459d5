package opensandbox

import (
	"cmp"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/dynrunner/dynrunner/guest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

const backendName = "opensandbox"

// Metadata keys on every sandbox the backend creates. The server stores them as Kubernetes
// labels, so keys and values follow the label rules.
const (
	MetaManagedBy  = "dynrunner.io/managed-by"
	MetaScope      = "dynrunner.io/scope"
	MetaTask       = "dynrunner.io/task-id"
	MetaEpoch      = "dynrunner.io/epoch"
	MetaInstanceID = "dynrunner.io/instance-id"
	MetaPool       = "dynrunner.io/pool"
	// MetaCreated is the creating controller's clock in Unix nanoseconds; it orders sandboxes
	// of the same task and epoch when concurrent starts converge and the server's createdAt
	// cannot tell them apart.
	MetaCreated = "dynrunner.io/created"
	// metaName is the API's human-readable name key.
	metaName = "name"
)

// managedBy is the value of MetaManagedBy.
const managedBy = "dynrunner"

// The environment variables `dynrunner guest` reads in the sandbox: its instance id, its
// single-use nonce, and the nonce endpoint's URL. Nothing else it receives is secret.
const (
	EnvInstanceID = guest.EnvInstanceID
	EnvNonce      = guest.EnvNonce
	EnvEndpoint   = guest.EnvEndpoint
)

// Keys of Handle.Data.
const (
	DataInstanceID = "instance_id"
	DataPool       = "pool"
)

// sandboxIDRe bounds the ids the backend puts into a path: the server's ids are UUIDs or
// Kubernetes names.
var sandboxIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// scopeQuery is the list filter of the backend's scope: the metadata parameter holds
// "key=value&key=value", which url.Values encodes once more as the API asks.
func (b *Backend) scopeQuery(extra map[string]string) url.Values {
	inner := url.Values{MetaManagedBy: {managedBy}, MetaScope: {b.cfg.Scope}}
	for k, v := range extra {
		inner.Set(k, v)
	}
	return url.Values{"metadata": {inner.Encode()}}
}

// metadata is a new sandbox's metadata.
func (b *Backend) metadata(task assignment.TaskID, epoch assignment.Epoch, instance string, created int64) map[string]string {
	return map[string]string{
		MetaManagedBy:  managedBy,
		MetaScope:      b.cfg.Scope,
		MetaTask:       task.String(),
		MetaEpoch:      epoch.String(),
		MetaInstanceID: instance,
		MetaPool:       b.cfg.Pool,
		MetaCreated:    strconv.FormatInt(created, 10),
		metaName:       "dynrunner-" + task.String() + "-" + epoch.String(),
	}
}

// handleOf is the handle of sb; ok is false for a sandbox that is not one of this scope's.
func (b *Backend) handleOf(sb sandbox) (podworker.Handle, bool) {
	m := sb.Metadata
	if m[MetaManagedBy] != managedBy || m[MetaScope] != b.cfg.Scope || !sandboxIDRe.MatchString(sb.ID) {
		return podworker.Handle{}, false
	}
	task, err := assignment.ParseTaskID(m[MetaTask])
	if err != nil {
		return podworker.Handle{}, false
	}
	epoch, err := assignment.ParseEpoch(m[MetaEpoch])
	if err != nil {
		return podworker.Handle{}, false
	}
	return podworker.Handle{
		Backend: backendName, ID: sb.ID, Task: task, Epoch: epoch,
		Data: map[string]string{DataInstanceID: m[MetaInstanceID], DataPool: m[MetaPool]},
	}, true
}

// older orders sandboxes of one task and epoch, the first created first: by the server's
// createdAt when both parse, then by the creating controller's clock (MetaCreated), then by id.
func older(a, b sandbox) int {
	ta, erra := time.Parse(time.RFC3339Nano, a.CreatedAt)
	tb, errb := time.Parse(time.RFC3339Nano, b.CreatedAt)
	byServer := 0
	if erra == nil && errb == nil {
		byServer = ta.Compare(tb)
	}
	ca, _ := strconv.ParseInt(a.Metadata[MetaCreated], 10, 64)
	cb, _ := strconv.ParseInt(b.Metadata[MetaCreated], 10, 64)
	return cmp.Or(byServer, cmp.Compare(ca, cb), cmp.Compare(a.ID, b.ID))
}

// checkHandle validates h and returns its sandbox id.
func checkHandle(h podworker.Handle) (string, error) {
	if h.Backend != backendName {
		return "", fmt.Errorf("opensandbox: handle of backend %q: %w", h.Backend, ErrInvalidHandle)
	}
	if !sandboxIDRe.MatchString(h.ID) {
		return "", fmt.Errorf("opensandbox: handle id %q: %w", h.ID, ErrInvalidHandle)
	}
	return h.ID, nil
}

// sandboxPath is the path of sandbox id.
func sandboxPath(id string) string { return pathSandboxes + "/" + url.PathEscape(id) }
