//go:build !race

package facade_test

// allocSlack widens the allocation bounds under the race detector (race_test.go).
const allocSlack = 1
