package vmworker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/podworker"
)

// Errors of Redeem. The endpoint maps them to HTTP statuses.
var (
	// ErrUnknownNonce: no such nonce, or not for this instance.
	ErrUnknownNonce = errors.New("vmworker: unknown nonce")
	// ErrNonceRedeemed: the nonce was redeemed before.
	ErrNonceRedeemed = errors.New("vmworker: nonce already redeemed")
	// ErrCredential (of Issue, and of Redeem for a record that holds no valid credential): a
	// Credential is a Gitea runner's capability token or a GitHub slot's JIT configuration,
	// exactly one of them.
	ErrCredential = errors.New("vmworker: a nonce's credential is a capability token or a JIT configuration, exactly one")
)

// Credential is what a guest receives for its nonce, its only credential: a Gitea
// assignment's capability token, with which its runner registers at the facade, or a GitHub
// slot's JIT configuration, with which GitHub's runner talks to GitHub. Never both.
type Credential struct {
	Token     string
	JITConfig string
}

// SpecCredential is the credential of an environment's spec, which a VM backend keeps in the
// controller and issues a nonce for: its capability token (podworker.TokenFile, a Gitea
// assignment's) or its JIT configuration (executor.JITConfigFile, a GitHub slot's). A spec
// with both, or neither, is refused with ErrCredential.
func SpecCredential(spec podworker.Spec) (Credential, error) {
	c := Credential{Token: string(spec.Files[podworker.TokenFile]), JITConfig: string(spec.Files[executor.JITConfigFile])}
	if err := c.Check(); err != nil {
		return Credential{}, fmt.Errorf("%w: the spec of task %d has %s", err, spec.Task, c.describe())
	}
	return c, nil
}

// describe names what c holds, never its values.
func (c Credential) describe() string {
	switch {
	case c.Token != "" && c.JITConfig != "":
		return "both a capability token and a JIT configuration"
	case c.Token != "":
		return "a capability token"
	case c.JITConfig != "":
		return "a JIT configuration"
	}
	return "neither a capability token nor a JIT configuration"
}

// Secret is the credential's secret, whichever it is.
func (c Credential) Secret() string { return c.Token + c.JITConfig }

// GitHub reports whether c is a GitHub slot's JIT configuration.
func (c Credential) GitHub() bool { return c.JITConfig != "" }

// Check returns ErrCredential unless exactly one of c's fields is set.
func (c Credential) Check() error {
	if (c.Token == "") == (c.JITConfig == "") {
		return ErrCredential
	}
	return nil
}

// Nonces issues and redeems single-use nonces; redemption is decided by a compare-and-swap in
// JetStream, so it holds across controller replicas and restarts.
type Nonces struct {
	kv  jetstream.KeyValue
	box *sealbox.Box
}

type nonceRecord struct {
	Task       assignment.TaskID `json:"task_id"`
	Epoch      assignment.Epoch  `json:"epoch"`
	InstanceID string            `json:"instance_id"`
	Token      string            `json:"token,omitempty"`
	JITConfig  string            `json:"jit_config,omitempty"`
	Redeemed   bool              `json:"redeemed"`
	Issued     time.Time         `json:"issued"`
}

// NewNonces returns Nonces keeping one record per nonce, sealed with box, in kv: the event
// log's eventlog.BucketNonces (eventlog.Log.Nonces), whose records expire after
// eventlog.Config.NoncesTTL, unredeemed nonces included.
func NewNonces(kv jetstream.KeyValue, box *sealbox.Box) *Nonces {
	return &Nonces{kv: kv, box: box}
}

func nonceKey(nonce string) string {
	s := sha256.Sum256([]byte(nonce))
	return hex.EncodeToString(s[:])
}

// NewNonce returns a fresh URL-safe nonce (256 bits).
func NewNonce() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("vmworker: nonce: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Issue records nonce as redeemable once by instanceID for cred, which it seals with the
// record; a cred that is not exactly one credential is refused with ErrCredential.
func (n *Nonces) Issue(ctx context.Context, nonce, instanceID string, task assignment.TaskID, epoch assignment.Epoch, cred Credential) error {
	if err := cred.Check(); err != nil {
		return fmt.Errorf("%w (issuing a nonce for task %d)", err, task)
	}
	rec := nonceRecord{Task: task, Epoch: epoch, InstanceID: instanceID, Token: cred.Token, JITConfig: cred.JITConfig,
		Issued: time.Now().UTC()}
	sealed, err := n.seal(nonce, rec)
	if err != nil {
		return err
	}
	if _, err := n.kv.Create(ctx, nonceKey(nonce), sealed); err != nil {
		return fmt.Errorf("vmworker: issue nonce for task %d: %w", task, err)
	}
	return nil
}

// Peek returns the assignment a nonce was issued for, without redeeming it.
func (n *Nonces) Peek(ctx context.Context, instanceID, nonce string) (assignment.TaskID, assignment.Epoch, error) {
	rec, _, err := n.read(ctx, instanceID, nonce)
	return rec.Task, rec.Epoch, err
}

func (n *Nonces) read(ctx context.Context, instanceID, nonce string) (nonceRecord, uint64, error) {
	key := nonceKey(nonce)
	e, err := n.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nonceRecord{}, 0, ErrUnknownNonce
	}
	if err != nil {
		return nonceRecord{}, 0, fmt.Errorf("vmworker: redeem: %w", err)
	}
	var rec nonceRecord
	plain, err := n.box.Open(e.Value(), nonceAAD(key))
	if err == nil {
		err = json.Unmarshal(plain, &rec)
	}
	if err != nil {
		return nonceRecord{}, 0, fmt.Errorf("vmworker: redeem: %w", err)
	}
	if rec.InstanceID != instanceID {
		return nonceRecord{}, 0, ErrUnknownNonce
	}
	if rec.Redeemed {
		return nonceRecord{}, 0, ErrNonceRedeemed
	}
	return rec, e.Revision(), nil
}

// Redeem trades a nonce for its credential, once; the record keeps no credential after.
func (n *Nonces) Redeem(ctx context.Context, instanceID, nonce string) (assignment.TaskID, assignment.Epoch, Credential, error) {
	key := nonceKey(nonce)
	rec, rev, err := n.read(ctx, instanceID, nonce)
	if err != nil {
		return 0, 0, Credential{}, err
	}
	cred := Credential{Token: rec.Token, JITConfig: rec.JITConfig}
	if err := cred.Check(); err != nil {
		return 0, 0, Credential{}, fmt.Errorf("vmworker: redeem: %w", err)
	}
	rec.Token, rec.JITConfig, rec.Redeemed = "", "", true
	sealed, err := n.seal(nonce, rec)
	if err != nil {
		return 0, 0, Credential{}, err
	}
	if _, err := n.kv.Update(ctx, key, sealed, rev); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return 0, 0, Credential{}, ErrNonceRedeemed // another redemption won the race
		}
		return 0, 0, Credential{}, fmt.Errorf("vmworker: redeem: %w", err)
	}
	return rec.Task, rec.Epoch, cred, nil
}

func nonceAAD(key string) []byte { return []byte("dynrunner/nonce/" + key) }

func (n *Nonces) seal(nonce string, rec nonceRecord) ([]byte, error) {
	plain, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("vmworker: nonce record: %w", err)
	}
	return n.box.Seal(plain, nonceAAD(nonceKey(nonce)))
}
