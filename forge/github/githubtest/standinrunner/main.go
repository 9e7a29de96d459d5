// Command standinrunner is a stand-in for the GitHub Actions runner (actions/runner), for tests
// only: it is not the real runner and speaks none of its protocol. It takes a JIT configuration
// of githubtest's fake on the command line as the real runner does, takes one job from the fake
// through the stand-in protocol of package standin, runs the job's script, reports the result
// and exits.
//
// Usage, as the real run.sh --jitconfig or Runner.Listener run --jitconfig:
//
//	standinrunner [run] --jitconfig <encoded JIT configuration>
//
// or, as the real runner reads its inputs from ACTIONS_RUNNER_INPUT_<NAME> (what dynrunner's
// executor uses, so the configuration is not on a command line other users may read):
//
//	ACTIONS_RUNNER_INPUT_JITCONFIG=<encoded JIT configuration> standinrunner
//
// It decodes the configuration (base64 of a JSON object of the base64 files .runner and
// .credentials), creates the .runner's WorkFolder (_work when empty; a relative one is under the
// working directory), waits for a job assigned to the runner's scale set, and runs the job's
// script with sh -c in the workspace WorkFolder/<repo>/<repo>. The step inherits the environment
// and gets, as from the real runner: CI=true, GITHUB_ACTIONS=true, GITHUB_SERVER_URL,
// GITHUB_REPOSITORY (owner/name), GITHUB_REPOSITORY_OWNER, GITHUB_RUN_ID, GITHUB_WORKFLOW_REF,
// GITHUB_EVENT_NAME, GITHUB_WORKSPACE, RUNNER_NAME and RUNNER_TEMP (WorkFolder/_temp). The
// step's output streams to stdout and is reported as the job's log (its first 256 KiB); the
// result is succeeded when the script exits 0, failed otherwise, canceled on SIGINT or SIGTERM.
// Progress lines go to stderr, prefixed "standinrunner: ".
//
// Environment:
//
//	STANDIN_RUNNER_CA_FILE          PEM certificates to trust for an https ServerUrl (the
//	                                fake's, githubtest.Server.CertificatePEM); required for
//	                                https, and the only roots trusted then.
//	ACTIONS_RUNNER_INPUT_JITCONFIG  the JIT configuration, when --jitconfig is not given; it
//	                                is not passed on to the job's step.
//
// Exit status: 0 once the job is reported, whatever its result; 2 for a malformed command line
// or JIT configuration; 1 for anything else (a refused credential, a runner removed or already
// used, a server that cannot be reached after bounded retries, a missing CA file, a signal).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/dynrunner/dynrunner/forge/github/githubtest/standin"
)

// caFileEnv names the file of PEM certificates the stand-in trusts for https.
const caFileEnv = "STANDIN_RUNNER_CA_FILE"

// jitEnv is the real runner's input variable for --jitconfig.
const jitEnv = "ACTIONS_RUNNER_INPUT_JITCONFIG"

// usageError is a malformed command line or JIT configuration: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv(caFileEnv), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "standinrunner: %v\n", err)
		if errors.As(err, new(usageError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, caFile string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	flags := flag.NewFlagSet("standinrunner", flag.ContinueOnError)
	flags.SetOutput(stderr)
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: standinrunner [run] --jitconfig <encoded JIT configuration>")
		fmt.Fprintln(stderr, "A stand-in for the GitHub Actions runner, for tests against githubtest's fake only.")
		flags.PrintDefaults()
	}
	jit := flags.String("jitconfig", "", "the encoded JIT configuration of githubtest's fake")
	if err := flags.Parse(args); err != nil {
		return usageError{err}
	}
	if flags.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", flags.Args())}
	}
	if *jit == "" {
		*jit = os.Getenv(jitEnv)
	}
	if *jit == "" {
		return usageError{errors.New("--jitconfig or " + jitEnv + " is required (the encoded JIT configuration)")}
	}
	cfg, err := standin.DecodeJITConfig(*jit)
	if err != nil {
		return usageError{fmt.Errorf("--jitconfig: %w", err)}
	}
	if err := standin.Validate(cfg); err != nil {
		return usageError{fmt.Errorf("--jitconfig: %w", err)}
	}
	client, err := httpClient(cfg.ServerURL, caFile)
	if err != nil {
		return err
	}
	r := &standin.Runner{
		Config: cfg,
		Client: client,
		Env:    withoutJIT(os.Environ()),
		Output: stdout,
		Logf:   func(format string, args ...any) { fmt.Fprintf(stderr, "standinrunner: "+format+"\n", args...) },
	}
	_, _, err = r.Run(ctx)
	return err
}

// httpClient trusts only the certificates of caFile for an https serverURL, and refuses to go
// on without them.
func httpClient(serverURL, caFile string) (*http.Client, error) {
	if !strings.HasPrefix(serverURL, "https:") {
		return &http.Client{}, nil
	}
	if caFile == "" {
		return nil, fmt.Errorf("the server %s is https: set %s to a PEM file of the certificate to trust (the fake's)", serverURL, caFileEnv)
	}
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", caFileEnv, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", caFileEnv, caFile)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: transport}, nil
}

// withoutJIT is env without the JIT configuration: the job's step is not handed its runner's
// credential.
func withoutJIT(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, jitEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}
