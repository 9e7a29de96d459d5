// Package devforge runs a real, throw-away Gitea for tests and the demo, and real Gitea runners
// ("static runners") to compare dynrunner against.
//
// Nothing here is faked: [Start] launches the Gitea binary built by scripts/tools.sh on a free
// loopback port with a sqlite database in a state directory, creates an admin user with an access
// token, and talks to Gitea only through its public REST API. [StartStaticRunner] registers and
// runs the upstream gitea-runner in host mode.
//
// The binaries are built once per version into a cache directory; [FindTools] locates them and
// returns [ErrToolsMissing] (with the command that builds them) when they are not there:
//
//	bash scripts/tools.sh all     # or: go tool task tools
//
// A typical end-to-end test:
//
//	tools, err := devforge.FindTools()
//	forge, err := devforge.Start(ctx, tools, devforge.Options{Dir: t.TempDir()})
//	defer forge.Close()
//	repo, err := forge.CreateRepo(ctx, "demo")
//	sha, err := forge.PushWorkflow(ctx, repo, ".gitea/workflows/ci.yml", workflowYAML)
//	run, err := forge.WaitRun(ctx, repo, sha)
//	log, err := forge.JobLog(ctx, repo, run.Jobs[0].ID)
//
// [NormalizeLog] strips what legitimately differs between two runs of the same job (timestamps,
// durations, runner names, paths, ids) so logs from different runners can be compared.
package devforge
