// Package scenarios holds the scenarios shipped with the simulator, one
// YAML file each, embedded so the command runs them without a checkout.
//
// Invariant: every file here parses and validates (the tests load them
// all) and names itself after its file; names are the file names without
// ".yaml". Units are those of package scenario.
package scenarios
