package flagenv

import (
	"flag"
	"testing"
)

func TestPrecedence(t *testing.T) {
	env := map[string]string{"SLUICE_REDIS_ADDR": "env:1", "SLUICE_REGION": "env-region", "SLUICE_PORT": "x"}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	addr := fs.String("redis-addr", "default:1", "")
	region := fs.String("region", "default", "")
	other := fs.String("other", "keep", "")
	if err := Parse(fs, "SLUICE", []string{"-region", "cli"}, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *addr != "env:1" || *region != "cli" || *other != "keep" {
		t.Fatalf("got addr=%q region=%q other=%q", *addr, *region, *other)
	}
}

func TestBadEnvValueNamesTheVariable(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Int("port", 1, "")
	err := Parse(fs, "SLUICE", nil, func(k string) string {
		if k == "SLUICE_PORT" {
			return "eighty"
		}
		return ""
	})
	if err == nil || err.Error()[:len("environment SLUICE_PORT")] != "environment SLUICE_PORT" {
		t.Fatalf("got %v", err)
	}
}

func TestListAndLogger(t *testing.T) {
	if got := List(" a:1, ,b:2,"); len(got) != 2 || got[0] != "a:1" || got[1] != "b:2" {
		t.Fatalf("List = %q", got)
	}
	if _, err := Logger("loud"); err == nil {
		t.Fatal("Logger accepted level loud")
	}
	if l, err := Logger("warn"); err != nil || l == nil {
		t.Fatalf("Logger(warn) = %v, %v", l, err)
	}
}
