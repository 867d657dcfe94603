//go:build !race

package envoyrls

const raceDetector = false
