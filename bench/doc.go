// Package bench holds dynrunner's benchmarks; it has no code of its own outside tests.
//
//	go tool task bench        # every benchmark once, as docs/benchmarks.md reports them
//
// BenchmarkPushToSuccess compares push-to-success latency with a static Gitea runner on a real
// Gitea; BenchmarkLifecycles and BenchmarkMemory10k drive the real scheduler, facade (over
// mTLS) and pod worker on an embedded JetStream with an in-memory forge and no-op
// environments; BenchmarkRestartWithHistory restarts a controller (a child process) over up to
// a million generated ended assignments. docs/benchmarks.md explains what each measures and
// records the results.
package bench
