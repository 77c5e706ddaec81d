//go:build race

package memory

// raceEnabled shortens the single-threaded scale tests, which the race
// detector slows tenfold without making them find more.
const raceEnabled = true
