package config

import (
	"math"
	"strconv"
)

// LocalPod configures the local pod backend (POD_BACKEND=local): the range of uids its
// environments run as when the controller is root.
type LocalPod struct {
	UIDBase  uint32
	UIDCount uint32
}

// The default range lies above the ids systemd hands out for containers (up to 1879048191)
// and well below the top of the uid space.
const (
	defaultLocalUIDBase  = 2_000_000_000
	defaultLocalUIDCount = 65536
)

// nobody is the overflow uid: files of unmapped users show as it, so no environment may be it.
const nobody = 65534

// loadLocal reads POD_LOCAL_UID_BASE and POD_LOCAL_UID_COUNT; it checks them only when the pod
// worker runs the local backend. c.PodConcurrency must be set.
func loadLocal(e *env, c Controller) LocalPod {
	l := LocalPod{
		UIDBase:  e.uint32("POD_LOCAL_UID_BASE", defaultLocalUIDBase),
		UIDCount: e.uint32("POD_LOCAL_UID_COUNT", defaultLocalUIDCount),
	}
	if !c.Has(PodWorker) || c.PodBackend != "local" {
		return l
	}
	last := uint64(l.UIDBase) + uint64(l.UIDCount) - 1
	switch {
	case l.UIDBase == 0:
		e.fail("POD_LOCAL_UID_BASE=0: uid 0 is root; want the first of a range of unused uids")
	case l.UIDCount < uint32(max(c.PodConcurrency, 1)):
		e.fail("POD_LOCAL_UID_COUNT=%d: below POD_CONCURRENCY=%d, every running environment needs a uid of its own", l.UIDCount, c.PodConcurrency)
	case last >= math.MaxUint32:
		e.fail("POD_LOCAL_UID_BASE=%d with POD_LOCAL_UID_COUNT=%d ends past the last uid, %d", l.UIDBase, l.UIDCount, uint32(math.MaxUint32-1))
	case uint64(l.UIDBase) <= nobody && nobody <= last:
		e.fail("POD_LOCAL_UID_BASE=%d with POD_LOCAL_UID_COUNT=%d includes %d (nobody)", l.UIDBase, l.UIDCount, nobody)
	}
	return l
}

func (e *env) uint32(name string, def uint32) uint32 {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		e.fail("%s=%q: want an integer from 0 to %d", name, v, uint32(math.MaxUint32))
		return def
	}
	return uint32(n)
}
