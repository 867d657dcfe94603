// Command mutate runs a package's tests against small changes to its
// code (mutants) and reports the changes no test noticed. `make mutate`
// runs it:
//
//	go run ./scripts/mutate [flags] PKGDIR
//
// It changes operators (< to <= and >, == to !=, + to -, * to /, && to
// ||, ++ to --), negates if conditions, drops a !, swaps true and false,
// moves integer literals by one (0 and 1 swap), zeroes float literals,
// removes continue and loop breaks, and makes numeric returns return 0.
// Each mutant is applied through go test -overlay, so the source tree is
// never written; a mutant that does not type-check is counted as not
// compiling without running go test.
//
// The Lua scripts a package embeds (//go:embed; cmd/go applies -overlay to
// embedded files too) are mutated with -lua, or by naming them in -files:
// relational and arithmetic operators (a unary minus is left alone: Lua
// has no unary plus), and swapped with or, if and elseif conditions negated
// (if X then to if not (X) then), a not dropped, true and false, numbers
// (0 and 1 swap, small integers move by one, fractions become 0),
// math.min and math.max, a break or an early return (one that ends an if
// or loop block, not a function) removed. Comments and string literals
// are skipped. A mutant Redis refuses to load (the tests fail with
// "Error compiling script") counts as not compiling. Survivors are
// printed as
//
//	file:line:col: original -> mutant
//
// followed by a count per file and the mutation score: the share of the
// compiling mutants the tests killed (failed or timed out on).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		if err != flag.ErrHelp {
			fmt.Fprintln(os.Stderr, "mutate:", err)
		}
		if code == 0 {
			code = 2
		}
	}
	os.Exit(code)
}

type options struct {
	files    map[string]bool
	lua      bool
	at       []string
	kinds    map[string]bool
	run      string
	skip     string
	timeout  time.Duration
	max      int
	seed     uint64
	race     bool
	jobs     int
	nice     int
	list     bool
	verbose  bool
	minScore float64
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("mutate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	files := fs.String("files", "", "comma-separated base names of the files to mutate, Go or embedded .lua (default: every non-test Go file, and with -lua every embedded .lua file)")
	at := fs.String("at", "", "comma-separated file:line or file:line:col: only the mutants there (to check a new test kills them)")
	kinds := fs.String("kinds", "", "comma-separated mutant kinds to make (binary,assign,incdec,negate,not,literal,bool,branch,return,minmax; default all)")
	var o options
	fs.BoolVar(&o.lua, "lua", false, "mutate the package's embedded .lua files instead of its Go files (-files may name either)")
	fs.StringVar(&o.run, "run", "", "go test -run regexp")
	fs.StringVar(&o.skip, "skip", "", "go test -skip regexp (e.g. a slow test that decides nothing)")
	fs.DurationVar(&o.timeout, "timeout", 0, "per-mutant test timeout (default: 3x the unmutated run, at least 30s)")
	fs.IntVar(&o.max, "max", 0, "run at most N compiling mutants, sampled with -seed (0: all)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the -max sample")
	fs.BoolVar(&o.race, "race", false, "run the tests with -race")
	fs.IntVar(&o.jobs, "j", 1, "mutants to test at once")
	fs.IntVar(&o.nice, "nice", 10, "run go under nice -n N (0: not)")
	fs.BoolVar(&o.list, "list", false, "list the mutants (after -files, -at, -max) without running them")
	fs.BoolVar(&o.verbose, "v", false, "print each mutant's outcome as it is known (and why one did not compile)")
	fs.Float64Var(&o.minScore, "min-score", 0, "exit 1 when the score (percent) is below this")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mutate [flags] PKGDIR")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2, fmt.Errorf("want one package directory, got %d arguments", fs.NArg())
	}
	o.files = set(*files)
	o.kinds = set(*kinds)
	if *at != "" {
		o.at = strings.Split(*at, ",")
	}
	if o.jobs < 1 {
		o.jobs = 1
	}
	dir := fs.Arg(0)
	if !strings.HasPrefix(dir, ".") && !filepath.IsAbs(dir) {
		dir = "./" + dir // a directory, not an import path
	}
	var nice []string
	if o.nice != 0 {
		if _, err := exec.LookPath("nice"); err == nil {
			nice = []string{"nice", "-n", strconv.Itoa(o.nice)}
		}
	}

	p, err := load(ctx, dir, nice)
	if err != nil {
		return 2, err
	}
	for name := range o.files {
		if !slices.ContainsFunc(append(p.files, p.luaFiles...), func(f *srcFile) bool { return filepath.Base(f.abs) == name }) {
			return 2, fmt.Errorf("-files: %s is neither a non-test Go file nor an embedded .lua file of %s", name, dir)
		}
	}
	if o.lua && len(p.luaFiles) == 0 {
		return 2, fmt.Errorf("-lua: %s embeds no .lua file", dir)
	}
	all := enumerate(p, o)
	// Mutants that do not type-check are set aside before sampling, so
	// -max counts mutants the tests run on.
	var building []*mutant
	broken := map[string]int{}
	for _, m := range all {
		if p.compiles(m) {
			building = append(building, m)
		} else {
			broken[m.file.rel]++
		}
	}
	mutants := sample(building, o.max, o.seed)
	if o.list {
		for _, m := range mutants {
			fmt.Fprintf(stdout, "%s [%s]\n", m, m.kind)
		}
		fmt.Fprintf(stdout, "%d mutants (of %d sites, %d not compiling)\n", len(mutants), len(all), len(all)-len(building))
		return 0, nil
	}

	tmp, err := os.MkdirTemp("", "mutate-")
	if err != nil {
		return 2, err
	}
	defer os.RemoveAll(tmp)
	r := &runner{pkgDir: dir, nice: nice, run: o.run, skip: o.skip, race: o.race, timeout: o.timeout, tmp: tmp, verbose: o.verbose}
	if p.usesRapid {
		// A property test that catches a mutant would write a fail file
		// into the package's testdata and spend up to half a minute
		// shrinking the counterexample, which only the verdict matters
		// here.
		r.binFlags = []string{"-rapid.nofailfile", "-rapid.shrinktime=1s"}
	}
	if r.timeout == 0 {
		r.timeout = time.Hour // the baseline itself is not cut short
		took, err := r.baseline(ctx)
		if err != nil {
			return 2, err
		}
		r.timeout = max(30*time.Second, 3*took)
		fmt.Fprintf(stderr, "mutate: unmutated tests pass in %v; per-mutant timeout %v\n", took.Round(time.Millisecond), r.timeout)
	} else if _, err := r.baseline(ctx); err != nil {
		return 2, err
	}
	fmt.Fprintf(stderr, "mutate: %d mutants of %d sites (%d not compiling) in %s\n", len(mutants), len(all), len(all)-len(building), p.path)

	results := make([]outcome, len(mutants))
	var (
		mu       sync.Mutex
		firstErr error
		done     int
		wg       sync.WaitGroup
	)
	next := make(chan int)
	for range o.jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				m := mutants[i]
				res, text, err := r.try(ctx, i, m)
				mu.Lock()
				results[i] = res
				done++
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if o.verbose {
					fmt.Fprintf(stderr, "[%d/%d] %s: %s\n", done, len(mutants), m, res)
					if res == notCompiling {
						// Why, so a build broken by something
						// else than the mutant is seen.
						fmt.Fprintf(stderr, "\t%s\n", firstLines(text, 5))
					}
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
feed:
	for i := range mutants {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return 2, firstErr
	}
	if err := ctx.Err(); err != nil {
		return 2, err
	}
	score := report(stdout, p, mutants, results, len(all), broken, o, time.Since(start))
	if score < o.minScore {
		return 1, nil
	}
	return 0, nil
}

// enumerate lists the mutants of the selected files, in file order: the
// Go files, then the Lua ones.
func enumerate(p *pkg, o options) []*mutant {
	var all []*mutant
	for _, f := range append(p.files, p.luaFiles...) {
		switch {
		case len(o.files) > 0:
			if !o.files[filepath.Base(f.abs)] {
				continue
			}
		case len(o.at) > 0:
			// -at names its files itself.
		case o.lua != f.lua:
			continue
		}
		var ms []*mutant
		if f.lua {
			ms = luaSites(f)
		} else {
			ms = sites(p.fset, f, p.info)
		}
		slices.SortStableFunc(ms, func(a, b *mutant) int { return a.pos.Offset - b.pos.Offset })
		for _, m := range ms {
			if len(o.kinds) > 0 && !o.kinds[m.kind] {
				continue
			}
			if len(o.at) > 0 && !matchesAt(m, o.at) {
				continue
			}
			all = append(all, m)
		}
	}
	return all
}

var atRE = regexp.MustCompile(`^(.*?):(\d+)(?::(\d+))?$`)

func matchesAt(m *mutant, at []string) bool {
	for _, a := range at {
		s := atRE.FindStringSubmatch(strings.TrimSpace(a))
		if s == nil {
			continue
		}
		if s[1] != filepath.Base(m.file.abs) && s[1] != m.file.rel {
			continue
		}
		if line, _ := strconv.Atoi(s[2]); line != m.pos.Line {
			continue
		}
		if s[3] != "" {
			if col, _ := strconv.Atoi(s[3]); col != m.pos.Column {
				continue
			}
		}
		return true
	}
	return false
}

// sample picks n mutants at random (the same ones for the same seed and
// source), kept in source order.
func sample(all []*mutant, n int, seed uint64) []*mutant {
	if n <= 0 || n >= len(all) {
		return all
	}
	idx := rand.New(rand.NewPCG(seed, 0x5eed)).Perm(len(all))[:n]
	slices.Sort(idx)
	out := make([]*mutant, n)
	for i, j := range idx {
		out[i] = all[j]
	}
	return out
}

// report prints the survivors, a line per file and the summary, and
// returns the score in percent.
func report(w io.Writer, p *pkg, mutants []*mutant, results []outcome, sites int, broken map[string]int, o options, took time.Duration) float64 {
	type counts [4]int
	perFile := map[string]*counts{}
	var total counts
	for i, m := range mutants {
		c := perFile[m.file.rel]
		if c == nil {
			c = new(counts)
			perFile[m.file.rel] = c
		}
		c[results[i]]++
		total[results[i]]++
		if results[i] == survived {
			fmt.Fprintln(w, m)
		}
	}
	for name, n := range broken {
		c := perFile[name]
		if c == nil {
			c = new(counts)
			perFile[name] = c
		}
		c[notCompiling] += n
		total[notCompiling] += n
	}
	score := func(c *counts) float64 {
		n := c[killed] + c[timedOut] + c[survived]
		if n == 0 {
			return 100
		}
		return 100 * float64(c[killed]+c[timedOut]) / float64(n)
	}
	line := func(c *counts) string {
		return fmt.Sprintf("%d mutants run: %d killed, %d timed out, %d survived (%d more not compiling); score %.1f%%",
			c[killed]+c[timedOut]+c[survived], c[killed], c[timedOut], c[survived], c[notCompiling], score(c))
	}
	names := make([]string, 0, len(perFile))
	for name := range perFile {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(w, "%s: %s\n", name, line(perFile[name]))
	}
	sampled := ""
	if o.max > 0 && o.max < sites {
		sampled = fmt.Sprintf(", -max %d sampled with -seed %d", o.max, o.seed)
	}
	fmt.Fprintf(w, "%s: %s (of %d sites%s; %v)\n", p.path, line(&total), sites, sampled, took.Round(time.Second))
	return score(&total)
}

func set(csv string) map[string]bool {
	m := map[string]bool{}
	for _, s := range strings.Split(csv, ",") {
		if s = strings.TrimSpace(s); s != "" {
			m[s] = true
		}
	}
	return m
}
