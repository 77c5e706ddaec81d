//go:build race

package memory_test

// raceOn shortens the concurrency tests that the race detector slows
// tenfold, keeping them long enough to fail without their fix.
const raceOn = true
