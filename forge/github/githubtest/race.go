//go:build race

package githubtest

// raceEnabled: this binary runs with the race detector, and so does the stand-in it builds.
const raceEnabled = true
