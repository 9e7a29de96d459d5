//go:build !unix

package standin

import "os/exec"

// ownProcessGroup does nothing here: cancelling kills the shell only.
func ownProcessGroup(*exec.Cmd) {}
