package devforge

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNormalizeLog(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{
			name: "empty",
			in:   "",
			want: "",
		},
		{
			name: "timestamps stripped",
			in:   "2026-12-02T13:15:04.7576542Z workflow prepared\n2026-12-02T13:15:04.7862956Z hello ***\n",
			want: "workflow prepared\nhello ***\n",
		},
		{
			name: "timestamp with offset and empty content",
			in:   "2026-12-02T13:15:04+02:00 \n2026-12-02T13:15:04.1Z\nend",
			want: "\n\nend\n",
		},
		{
			name: "runner line",
			in:   "2026-12-02T13:15:04.7544827Z static-runner(version:dev) received task 17 of job hello, be triggered by event: push",
			want: "<runner>(version:<version>) received task <id> of job hello, be triggered by event: push\n",
		},
		{
			name: "runner line with another runner name and version",
			in:   "dynrunner-pod 7f3a(version:v1.0.8) received task 3 of job build (x), be triggered by event: workflow_dispatch",
			want: "<runner>(version:<version>) received task <id> of job build (x), be triggered by event: workflow_dispatch\n",
		},
		{
			name: "host workdir",
			in:   "/tmp/TestStaticRunnerJob123/002/runner/work/0a1b2c3d4e5f6789/hostexecutor/src",
			want: "<workdir>/hostexecutor/src\n",
		},
		{
			name: "host workdir outside tmp, act and tmp dirs, tool cache",
			in:   "GITHUB_WORKSPACE=/var/lib/dynrunner/job/ffffffffffffffff/hostexecutor RUNNER_TEMP=/root/.cache/act/0123456789abcdef/tmp RUNNER_TOOL_CACHE=/root/.cache/act/tool_cache",
			want: "GITHUB_WORKSPACE=<workdir>/hostexecutor RUNNER_TEMP=<workdir>/tmp RUNNER_TOOL_CACHE=<workdir>/tool_cache\n",
		},
		{
			name: "temporary paths",
			in:   "wrote /tmp/tmp.Xy12ab/out.txt and '/var/tmp/x' but not /home/u/tmp/keep",
			want: "wrote <tmp> and '<tmp>' but not /home/u/tmp/keep\n",
		},
		{
			name: "durations",
			in:   "Success - Main build [1.234s] took 15ms, then 1m2.5s and 3µs; 200 OK stays",
			want: "Success - Main build [<duration>] took <duration>, then <duration> and <duration>; 200 OK stays\n",
		},
		{
			name: "commit shas",
			in:   "HEAD is now at 3f786850e387550fdab836ed7e6dc881de23001b, sha256 " + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" + ", short 3f78685 kept",
			want: "HEAD is now at <sha>, sha256 <sha>, short 3f78685 kept\n",
		},
		{
			name: "uuids",
			in:   "runner uuid 123e4567-e89b-12d3-a456-426614174000 registered",
			want: "runner uuid <uuid> registered\n",
		},
		{
			name: "ids in urls and task names",
			in:   "see http://127.0.0.1:3000/devadmin/hello/actions/runs/12/jobs/3 and /api/v1/repos/a/b/actions/jobs/45/logs, container GITEA-ACTIONS-TASK-99_WORKFLOW, Task 4 done",
			want: "see http://127.0.0.1:3000/devadmin/hello/actions/runs/<id>/jobs/<id> and /api/v1/repos/a/b/actions/jobs/<id>/logs, container GITEA-ACTIONS-TASK-<id>_WORKFLOW, Task <id> done\n",
		},
		{
			name: "crlf, trailing blanks and trailing empty rows",
			in:   "a  \r\nb\t\r\n2026-12-02T13:15:04.7987862Z \n\n",
			want: "a\nb\n",
		},
		{
			name: "output and masked secrets kept",
			in:   "2026-12-02T13:15:04.7597296Z echo hello ***\n2026-12-02T13:15:04.7597374Z shell: bash --noprofile --norc -e -o pipefail {0}\n",
			want: "echo hello ***\nshell: bash --noprofile --norc -e -o pipefail {0}\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, NormalizeLog(tt.in), "NormalizeLog(%q)", tt.in)
		})
	}
}

// TestNormalizeLogComparesRunners checks the property the e2e tests rely on: the same job on two
// runners normalizes to the same text, and a real difference survives.
func TestNormalizeLogComparesRunners(t *testing.T) {
	static := `2026-12-02T13:15:04.7544827Z static-runner(version:dev) received task 1 of job hello, be triggered by event: push
2026-12-02T13:15:04.7576542Z workflow prepared
2026-12-02T13:15:04.7592189Z Run Main echo hello ***
2026-12-02T13:15:04.7597039Z ::group::Run echo hello ***
2026-12-02T13:15:04.7597296Z echo hello ***
2026-12-02T13:15:04.7597374Z shell: bash --noprofile --norc -e -o pipefail {0}
2026-12-02T13:15:04.7597499Z ::endgroup::
2026-12-02T13:15:04.7862956Z hello *** in /tmp/TestA/002/runner/work/0123456789abcdef/hostexecutor
2026-12-02T13:15:04.7886802Z Cleaning up container for job hello
2026-12-02T13:15:04.7987862Z Job succeeded
`
	dyn := `2026-12-03T08:01:10.1000000Z dynrunner-5f2c(version:v1.0.8) received task 42 of job hello, be triggered by event: push
2026-12-03T08:01:10.2000000Z workflow prepared
2026-12-03T08:01:10.3000000Z Run Main echo hello ***
2026-12-03T08:01:10.3000000Z ::group::Run echo hello ***
2026-12-03T08:01:10.3000000Z echo hello ***
2026-12-03T08:01:10.3000000Z shell: bash --noprofile --norc -e -o pipefail {0}
2026-12-03T08:01:10.3000000Z ::endgroup::
2026-12-03T08:01:11.9000000Z hello *** in /var/lib/dynrunner/exec/fedcba9876543210/hostexecutor
2026-12-03T08:01:12.0000000Z Cleaning up container for job hello
2026-12-03T08:01:12.1000000Z Job succeeded
2026-12-03T08:01:12.1000000Z 
`
	assert.Equal(t, NormalizeLog(static), NormalizeLog(dyn), "normalized logs differ")
	failed := dyn[:len(dyn)-len("Job succeeded\n2026-12-03T08:01:12.1000000Z \n")] + "Job failed\n"
	assert.NotEqual(t, NormalizeLog(static), NormalizeLog(failed), "a failed job normalizes like a successful one")
}
