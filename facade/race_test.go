//go:build race

package facade_test

// allocSlack widens the allocation bounds under the race detector, which drops sync.Pool
// entries at random so that buffers are allocated again: a facade that read a 100 MB body
// whole would still allocate more than the widened bound.
const allocSlack = 2
