// Command configdoc writes docs/config.md, the configuration reference,
// from the doc comments of package config's schema (its Go AST): every
// field reachable from config.Config with its YAML path, type, unit,
// default, rule and an example. It refuses to write when a field is
// undocumented. Run it through go generate ./pkg/config.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	dir := flag.String("dir", ".", "directory of package config")
	out := flag.String("o", "", "output file (default: standard output)")
	flag.Parse()
	doc, err := Generate(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "configdoc:", err)
		os.Exit(1)
	}
	if *out == "" {
		os.Stdout.Write(doc)
		return
	}
	if err := os.WriteFile(*out, doc, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "configdoc:", err)
		os.Exit(1)
	}
}
