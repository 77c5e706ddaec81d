//go:build !race

package memory_test

const raceOn = false
