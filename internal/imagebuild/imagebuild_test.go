package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// moduleRoot is the repository root, relative to this package.
const moduleRoot = "../.."

// binDir is where binaries built the commands ("" until then).
var binDir string

// binaries builds every command once for the tests of this package, the
// way `make image` does.
var binaries = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sluice-image-bin-")
	binDir = dir
	if err != nil {
		return "", err
	}
	return dir, BuildBinaries(context.Background(), "go", moduleRoot, dir, "")
})

func builtBinaries(t *testing.T) string {
	t.Helper()
	dir, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// tiny holds the builds of the tiny program, one per build environment,
// shared by the package's tests: its source and flags are the same for
// every test, so building it again gave the same binary.
var tiny struct {
	sync.Mutex
	dir   string            // "" until the first build
	built map[string]string // the extra environment, joined -> the binary
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{binDir, tiny.dir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// tinyBinaries puts a small static Go program as "regional" (and as
// "sluicectl" when both) into a new directory, for the tests that need a
// valid binary but not the real ones. The program is built once per
// environment for the package's tests.
func tinyBinaries(t *testing.T, both bool, env ...string) string {
	t.Helper()
	data, err := os.ReadFile(tinyBinary(t, env...))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names := []string{"regional"}
	if both {
		names = append(names, "sluicectl")
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// tinyBinary builds the tiny program with GoBuildEnv and env, once, and
// returns its path.
func tinyBinary(t *testing.T, env ...string) string {
	t.Helper()
	tiny.Lock()
	defer tiny.Unlock()
	key := strings.Join(env, " ")
	if p, ok := tiny.built[key]; ok {
		return p
	}
	if tiny.dir == "" {
		dir, err := os.MkdirTemp("", "sluice-image-tiny-")
		if err != nil {
			t.Fatal(err)
		}
		tiny.dir, tiny.built = dir, map[string]string{}
		for name, data := range map[string]string{
			"go.mod":  "module example.com/tiny\n\ngo 1.26\n",
			"main.go": "package main\n\nfunc main() { println(\"tiny\") }\n",
		} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := filepath.Join(tiny.dir, "bin", strconv.Itoa(len(tiny.built)), "tiny")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, ".")
	cmd.Dir = tiny.dir
	cmd.Env = append(append(os.Environ(), GoBuildEnv...), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	tiny.built[key] = out
	return out
}

// testCABundle writes a PEM bundle of one self-signed certificate.
func testCABundle(t *testing.T) (string, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(0, 0).Add(100 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, data
}

// hasGit says whether the module was built from a git work tree, so its
// binaries carry a revision: go build stamps one only where .git is a
// directory (a linked worktree's .git is a file, and its builds carry
// none).
func hasGit() bool {
	fi, err := os.Stat(filepath.Join(moduleRoot, ".git"))
	return err == nil && fi.IsDir()
}

// TestImageArchive builds the image from freshly built commands, writes the
// archive, reads it back both as Docker's manifest.json and as an OCI
// layout, checks what the image runs and as whom, then extracts the
// commands from it and runs them.
func TestImageArchive(t *testing.T) {
	start := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	bin := builtBinaries(t)
	phase("built the commands")
	caPath, caData := testCABundle(t)
	res, err := Build(bin, caPath)
	if err != nil {
		t.Fatal(err)
	}
	phase("built the image")
	ref, err := Reference(Repository, res.Tag)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "sluice.tar")
	if err := WriteFile(archive, ref, res.Image); err != nil {
		t.Fatal(err)
	}
	want, err := res.Image.Digest()
	if err != nil {
		t.Fatal(err)
	}
	phase("wrote the archive")

	// As docker load reads it: manifest.json and its RepoTags. (The
	// reader makes its own Docker manifest, so the config and the layers
	// are compared, not the manifest digest.)
	img, err := tarball.ImageFromPath(archive, &ref)
	if err != nil {
		t.Fatalf("reading %s as a docker archive: %v", archive, err)
	}
	if err := sameContent(img, res.Image); err != nil {
		t.Fatalf("docker archive: %v", err)
	}

	phase("read it as a docker archive")
	// As OCI tools read it: oci-layout, index.json and blobs/.
	ociDir := t.TempDir()
	untar(t, archive, ociDir)
	idx, err := layout.ImageIndexFromPath(ociDir)
	if err != nil {
		t.Fatalf("reading the OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != want {
		t.Fatalf("index.json lists %+v, want one manifest %v", im.Manifests, want)
	}
	if got := im.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != res.Tag {
		t.Errorf("index.json ref.name %q, want %q", got, res.Tag)
	}
	if got := im.Manifests[0].Annotations["io.containerd.image.name"]; got != ref.Name() {
		t.Errorf("index.json io.containerd.image.name %q, want %q", got, ref.Name())
	}
	ociImg, err := idx.Image(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := validateLayers(ociImg); err != nil {
		t.Fatalf("OCI layout: %v", err)
	}

	phase("read it as an OCI layout")
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/regional"}) {
		t.Errorf("entrypoint %q, want [/usr/local/bin/regional]", c.Entrypoint)
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	labels := c.Labels
	if labels[LabelSource] != "https://github.com/sluicehq/sluice" {
		t.Errorf("source label %q", labels[LabelSource])
	}
	if v := labels[LabelVersion]; v == "" || v != res.Info.Version {
		t.Errorf("version label %q, want the binaries' %q", v, res.Info.Version)
	}
	if hasGit() && !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(labels[LabelRevision]) {
		t.Errorf("revision label %q, want the commit the binaries were built from", labels[LabelRevision])
	}

	files := extract(t, img)
	phase("extracted the file system")
	for _, p := range []string{"usr/local/bin/agent", "usr/local/bin/global", "usr/local/bin/regional", "usr/local/bin/sluicectl"} {
		if f, ok := files[p]; !ok || f.mode&0o111 == 0 {
			t.Errorf("image lacks the executable /%s", p)
		}
	}
	if f := files["etc/ssl/certs/ca-certificates.crt"]; !bytes.Equal(f.data, caData) {
		t.Errorf("the image's CA bundle is not the one given (%d bytes)", len(f.data))
	}
	if f := files["etc/passwd"]; !strings.Contains(string(f.data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot user 65532:\n%s", f.data)
	}
	if f := files["tmp"]; !f.dir || f.mode&0o1777 != 0o1777 {
		t.Errorf("/tmp is not a world-writable sticky directory: %+v", f)
	}

	// Run the commands taken out of the image.
	out := t.TempDir()
	for _, cmd := range []string{"agent", "global", "regional", "sluicectl"} {
		p := filepath.Join(out, cmd)
		if err := os.WriteFile(p, files["usr/local/bin/"+cmd].data, 0o755); err != nil {
			t.Fatal(err)
		}
		got, err := exec.Command(p, "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", cmd, err)
		}
		line := strings.TrimSpace(string(got))
		if !strings.HasPrefix(line, cmd+" "+res.Info.Version) || !strings.Contains(line, res.Info.Revision) {
			t.Errorf("%s --version printed %q, want %q and the revision %q", cmd, line, cmd+" "+res.Info.Version, res.Info.Revision)
		}
		if cmd == "sluicectl" {
			continue
		}
		// A daemon's -h prints its usage and succeeds; SLUICE_VERSION in
		// the environment does not make it print its version.
		h := exec.Command(p, "-h")
		h.Env = append(os.Environ(), "SLUICE_VERSION=1.0")
		var stderr bytes.Buffer
		h.Stderr = &stderr
		if err := h.Run(); err != nil {
			t.Errorf("%s -h: %v\n%s", cmd, err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "-version") || strings.Contains(stderr.String(), "help requested") {
			t.Errorf("%s -h printed:\n%s", cmd, stderr.String())
		}
	}
	phase("ran the commands")
}

// sameContent says whether a and b have the same config and layers.
func sameContent(a, b v1.Image) error {
	ca, err := a.ConfigName()
	if err != nil {
		return err
	}
	cb, err := b.ConfigName()
	if err != nil {
		return err
	}
	if ca != cb {
		return fmt.Errorf("config %v, want %v", ca, cb)
	}
	la, err := a.Layers()
	if err != nil {
		return err
	}
	lb, err := b.Layers()
	if err != nil {
		return err
	}
	if len(la) != len(lb) {
		return fmt.Errorf("%d layers, want %d", len(la), len(lb))
	}
	for i := range la {
		da, err := la[i].DiffID()
		if err != nil {
			return err
		}
		db, err := lb[i].DiffID()
		if err != nil {
			return err
		}
		if da != db {
			return fmt.Errorf("layer %d: diff id %v, want %v", i, da, db)
		}
	}
	return nil
}

// validateLayers reads every layer of img, checking sizes and digests.
func validateLayers(img v1.Image) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		h, n, err := v1.SHA256(rc)
		rc.Close()
		if err != nil {
			return err
		}
		d, _ := l.Digest()
		if h != d {
			return errors.New("layer digest mismatch " + h.String() + " != " + d.String())
		}
		if size, _ := l.Size(); size != n {
			return errors.New("layer size mismatch")
		}
	}
	return nil
}

type extracted struct {
	data []byte
	mode int64
	dir  bool
}

// extract flattens img's file system.
func extract(t *testing.T, img v1.Image) map[string]extracted {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]extracted{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimSuffix(h.Name, "/")] = extracted{data: data, mode: h.Mode, dir: h.Typeflag == tar.TypeDir}
	}
}

// untar unpacks the archive into dir.
func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(h.Name, "..") || filepath.IsAbs(h.Name) {
			t.Fatalf("archive entry %q escapes the archive", h.Name)
		}
		p := filepath.Join(dir, h.Name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBuildIsReproducible: the same binaries and CA bundle give the same
// image digest.
func TestBuildIsReproducible(t *testing.T) {
	bin := tinyBinaries(t, true)
	ca, _ := testCABundle(t)
	var digests []v1.Hash
	for range 2 {
		res, err := Build(bin, ca)
		if err != nil {
			t.Fatal(err)
		}
		d, err := res.Image.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds of the same inputs: %v and %v", digests[0], digests[1])
	}
}

// TestBuildRefusesBadInput: what cannot make a working image is refused
// with a message naming the problem, and no archive is written.
func TestBuildRefusesBadInput(t *testing.T) {
	ca, _ := testCABundle(t)
	script := t.TempDir()
	if err := os.WriteFile(filepath.Join(script, "regional"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tiny := tinyBinaries(t, true)
	noPEM := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(noPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, bin, ca, want string
	}{
		{"empty dir", t.TempDir(), ca, "holds no executable"},
		{"not a Go binary", script, ca, "not a Go binary"},
		{"not static", tinyBinaries(t, false, "CGO_ENABLED=1"), ca, "build it with CGO_ENABLED=0"},
		{"not linux", tinyBinaries(t, false, "GOOS=freebsd"), ca, "needs GOOS=linux"},
		{"no CA bundle", tiny, filepath.Join(t.TempDir(), "missing.pem"), "CA bundle"},
		{"CA bundle without certificates", tiny, noPEM, "holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.bin, tc.ca)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("bad tag", func(t *testing.T) {
		if _, err := Reference(Repository, "has space"); err == nil {
			t.Fatal("Reference accepted a tag with a space")
		}
	})
	// Each part is checked on its own: the error names the part at fault.
	for _, tc := range []struct {
		repo, tag, want, never string
	}{
		{Repository, "Bad:tag", `image tag "Bad:tag"`, "repository"},
		{Repository, "a/b", `image tag "a/b"`, "repository"},
		{Repository, "-dash", `image tag "-dash"`, "repository"},
		{Repository, strings.Repeat("x", 129), "image tag", "repository"},
		{"Sluice/UPPER", "0.2.0", `image repository "Sluice/UPPER"`, "image tag"},
	} {
		t.Run("bad name "+tc.repo+":"+tc.tag, func(t *testing.T) {
			_, err := Reference(tc.repo, tc.tag)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.never) {
				t.Fatalf("Reference(%q, %q) = %v, want an error with %q and without %q", tc.repo, tc.tag, err, tc.want, tc.never)
			}
		})
	}
	for _, tag := range []string{"0.2.0", "0.0.0-20261201163947-10e311de9ac9-dirty", "dev", "_x", strings.Repeat("x", 128)} {
		if ref, err := Reference(Repository, tag); err != nil || ref.TagStr() != tag {
			t.Errorf("Reference(%q, %q) = %v, %v", Repository, tag, ref, err)
		}
	}
	t.Run("no regional", func(t *testing.T) {
		dir := t.TempDir()
		data, err := os.ReadFile(filepath.Join(tiny, "sluicectl"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "sluicectl"), data, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := Build(dir, ca); err == nil || !strings.Contains(err.Error(), "no regional binary") {
			t.Fatalf("Build = %v", err)
		}
	})
}

func TestTagOf(t *testing.T) {
	for in, want := range map[string]string{
		"v0.2.0": "0.2.0",
		"v0.0.0-20261201163947-10e311de9ac9+dirty": "0.0.0-20261201163947-10e311de9ac9-dirty",
		"(devel)": "dev",
		"":        "dev",
	} {
		got := TagOf(in)
		if got != want {
			t.Errorf("TagOf(%q) = %q, want %q", in, got, want)
		}
		if _, err := name.NewTag("sluicehq/sluice:" + got); err != nil {
			t.Errorf("TagOf(%q) = %q is not a valid tag: %v", in, got, err)
		}
	}
}

// TestDockerfileMatchesImage: the Dockerfile for people who build their
// own makes the same user, entrypoint, paths and labels.
func TestDockerfileMatchesImage(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(moduleRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	for _, want := range []string{
		"USER " + User + "\n",
		`ENTRYPOINT ["` + Entrypoint[0] + `"]`,
		"CGO_ENABLED=0",
		"-trimpath",
		"/rootfs" + BinDir + "/",
		"/etc/ssl/certs/ca-certificates.crt",
		LabelSource + `="` + Source + `"`,
		LabelVersion + "=",
		LabelRevision + "=",
		LabelCreated + "=",
		"--build-arg REVISION=",
		"FROM scratch",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}
