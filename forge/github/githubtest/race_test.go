//go:build race

package githubtest_test

// raceEnabled: the tests run with -race, and so does the stand-in runner they build.
const raceEnabled = true
