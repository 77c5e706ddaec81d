//go:build race

package redis

// raceEnabled shortens the property sequences, which the race detector
// slows severalfold (every step is a round trip) without making them find
// more.
const raceEnabled = true
