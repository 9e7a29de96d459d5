package podworkertest

import (
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// backendPackage is the import path of the package that defines b's type.
func backendPackage(b any) string {
	t := reflect.TypeOf(b)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// checkNoGoroutines fails t if, after timeout, a goroutine still runs a function of package pkg.
// Only function frames count, not "created by" lines, so goroutines a library started on the
// backend's behalf are not blamed on it.
func checkNoGoroutines(t *testing.T, pkg string, timeout time.Duration) {
	t.Helper()
	var leaked []string
	if poll(timeout, func() bool {
		leaked = goroutinesIn(pkg)
		return len(leaked) == 0
	}) {
		return
	}
	t.Errorf("%d goroutines of %s still run with no environment left:\n\n%s",
		len(leaked), pkg, strings.Join(leaked, "\n\n"))
}

// goroutinesIn returns the stacks of the goroutines with a frame in package pkg.
func goroutinesIn(pkg string) []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		for line := range strings.SplitSeq(g, "\n") {
			if strings.HasPrefix(line, pkg+".") {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// NoGoroutineLeak fails t if, after timeout, a goroutine still runs a function of the package
// that defines backend's type. Other conformance suites (the VM backends') use it too.
func NoGoroutineLeak(t *testing.T, backend any, timeout time.Duration) {
	t.Helper()
	checkNoGoroutines(t, backendPackage(backend), timeout)
}
