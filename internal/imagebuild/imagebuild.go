// Package imagebuild builds Sluice's container image without a container
// daemon: one image holding every command (global, regional, sluicectl and
// any other cmd/ binary) as static Linux binaries in /usr/local/bin, run as
// a non-root user, with a CA bundle for TLS to etcd, Redis and peers.
//
// One image rather than one per command: the commands share most of their
// code and dependencies, so a second image would mostly repeat the first;
// one tag pins one release of every component, which is what the
// Kubernetes overlays roll out per region; and an operator's sluicectl
// always matches the daemons it talks to. The Deployments pick the
// command (command: [/usr/local/bin/regional]); the image's default is
// the regional service, the part every region runs.
//
// The image is written as a tar holding both an OCI image layout
// (oci-layout, index.json, blobs/) and Docker's manifest.json, the same
// shape `docker save` writes, so `docker load`, `podman load` and OCI tools
// all read it; like docker save's, its layers are uncompressed (a push to
// a registry compresses them, so the registry's digest of the image is not
// the archive's). File times and the creation time are the
// binaries' VCS commit time, so the same commit and CA bundle give the
// same image digest.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sluicehq/sluice/internal/version"
)

const (
	// Repository is the image name the Kubernetes manifests use.
	Repository = "sluicehq/sluice"
	// Source is the project the image is built from (label
	// org.opencontainers.image.source).
	Source = "https://github.com/sluicehq/sluice"
	// BinDir is where the commands live in the image.
	BinDir = "/usr/local/bin"
	// DefaultCommand is the command the image runs when none is given.
	DefaultCommand = "regional"
	// UID and GID are the non-root user and group the image runs as
	// ("nonroot", the same id distroless images use; the manifests'
	// runAsUser).
	UID, GID = 65532, 65532
	// DefaultCABundle is the PEM bundle copied into the image: the build
	// machine's system bundle (on Debian and Ubuntu, the ca-certificates
	// package's). Go reads the same path inside the image.
	DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"
)

// User is the image's user, numeric so Kubernetes' runAsNonRoot can check
// it without a passwd lookup.
var User = fmt.Sprintf("%d:%d", UID, GID)

// Entrypoint is the image's entrypoint.
var Entrypoint = []string{BinDir + "/" + DefaultCommand}

// Label keys (OCI image annotations, used as config labels).
const (
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelSource   = "org.opencontainers.image.source"
	LabelCreated  = "org.opencontainers.image.created"
	LabelTitle    = "org.opencontainers.image.title"
)

// GoBuildArgs are the arguments of `go build` (after "build") that produce
// the image's binaries into dir: static (CGO_ENABLED=0 in GoBuildEnv),
// without the build machine's paths (-trimpath), stamped with the VCS
// revision even where GOFLAGS turns stamping off, and stripped of the
// symbol table (the build information --version reads is kept).
func GoBuildArgs(dir string) []string {
	return []string{"-buildvcs=auto", "-trimpath", "-ldflags=-s -w", "-o", dir + string(filepath.Separator), "./cmd/..."}
}

// GoBuildEnv is added to the environment of `go build` for the image:
// static Linux binaries.
var GoBuildEnv = []string{"CGO_ENABLED=0", "GOOS=linux"}

// BuildBinaries runs `go build` in the module at moduleDir, writing every
// command into dir. goarch "" builds for the machine's architecture.
func BuildBinaries(ctx context.Context, goTool, moduleDir, dir, goarch string) error {
	cmd := exec.CommandContext(ctx, goTool, append([]string{"build"}, GoBuildArgs(dir)...)...)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), GoBuildEnv...)
	if goarch != "" {
		cmd.Env = append(cmd.Env, "GOARCH="+goarch)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// Binary is one command put in the image.
type Binary struct {
	Name string // file name in BinDir
	Info version.Info
	Arch string // GOARCH
}

// Result is a built image and what it was built from.
type Result struct {
	Image    v1.Image
	Binaries []Binary
	// Info is the build information every binary shares.
	Info version.Info
	// Tag is the default tag: the binaries' module version made a valid
	// image tag.
	Tag string
}

// Build makes the image from every executable in binDir, each a static
// linux Go binary of the same commit, and the PEM bundle at caBundle.
func Build(binDir, caBundle string) (*Result, error) {
	bins, err := readBinaries(binDir)
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(bins, func(b Binary) bool { return b.Name == DefaultCommand }) {
		return nil, fmt.Errorf("%s holds no %s binary, the image's entrypoint", binDir, DefaultCommand)
	}
	info, arch := bins[0].Info, bins[0].Arch
	for _, b := range bins[1:] {
		if b.Info.Version != info.Version || b.Info.Revision != info.Revision || b.Arch != arch {
			return nil, fmt.Errorf("%s: binaries of different builds: %s is %s %s/%s, %s is %s %s/%s",
				binDir, bins[0].Name, info.Version, info.Revision, arch, b.Name, b.Info.Version, b.Info.Revision, b.Arch)
		}
	}
	created := time.Unix(0, 0).UTC()
	if t, err := time.Parse(time.RFC3339, info.Time); err == nil {
		created = t.UTC()
	}
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w", err)
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", caBundle)
	}

	base, err := layer(created, baseFiles(ca))
	if err != nil {
		return nil, err
	}
	var files []file
	for _, b := range bins {
		data, err := os.ReadFile(filepath.Join(binDir, b.Name))
		if err != nil {
			return nil, err
		}
		files = append(files, file{path: strings.TrimPrefix(BinDir, "/") + "/" + b.Name, mode: 0o755, data: data})
	}
	binLayer, err := layer(created, files)
	if err != nil {
		return nil, err
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "imagebuild: passwd, group, nsswitch.conf, CA bundle, /tmp", Comment: "base"}},
		mutate.Addendum{Layer: binLayer, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "imagebuild: " + strings.Join(names(bins), ", "), Comment: "commands"}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: created}
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: Entrypoint,
		Env:        []string{"PATH=" + BinDir + ":/usr/bin:/bin", "SSL_CERT_FILE=" + DefaultCABundle},
		WorkingDir: "/",
		Labels: map[string]string{
			LabelVersion:  info.Version,
			LabelRevision: info.Revision,
			LabelSource:   Source,
			LabelCreated:  created.Format(time.RFC3339),
			LabelTitle:    "Sluice",
		},
		StopSignal: "SIGTERM",
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return &Result{Image: img, Binaries: bins, Info: info, Tag: TagOf(info.Version)}, nil
}

// TagOf turns a module version into an image tag: a release v0.2.0 is
// tagged 0.2.0 (like the manifests' tags), a pseudo-version keeps its
// commit, and "+" (not allowed in a tag) becomes "-". A build without a
// version is tagged dev.
func TagOf(v string) string {
	if v == "" || v == "(devel)" {
		return "dev"
	}
	v = strings.TrimPrefix(v, "v")
	v = strings.ReplaceAll(v, "+", "-")
	var b strings.Builder
	for _, r := range v {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	t := strings.TrimLeft(b.String(), ".-")
	if t == "" {
		return "dev"
	}
	return t[:min(len(t), 128)]
}

func names(bins []Binary) []string {
	out := make([]string, len(bins))
	for i, b := range bins {
		out[i] = b.Name
	}
	return out
}

// readBinaries lists the executables of dir and checks each is a static
// Linux Go binary with build information.
func readBinaries(dir string) ([]Binary, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var bins []Binary
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		if fi.Mode()&0o111 == 0 {
			continue
		}
		p := filepath.Join(dir, e.Name())
		bi, err := buildinfo.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("%s: not a Go binary: %w", p, err)
		}
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		if settings["GOOS"] != "linux" {
			return nil, fmt.Errorf("%s is built for %s; the image needs GOOS=linux", p, settings["GOOS"])
		}
		if settings["CGO_ENABLED"] != "0" {
			return nil, fmt.Errorf("%s is not static; build it with CGO_ENABLED=0", p)
		}
		bins = append(bins, Binary{Name: e.Name(), Info: version.FromBuildInfo(bi), Arch: settings["GOARCH"]})
	}
	if len(bins) == 0 {
		return nil, fmt.Errorf("%s holds no executable", dir)
	}
	return bins, nil
}

// file is one entry of a layer: a regular file, or a directory when dir.
type file struct {
	path     string // without leading slash
	mode     int64
	data     []byte
	dir      bool
	uid, gid int
}

// baseFiles are the image's files besides the commands: the users (root
// and nonroot) for tools that look names up, the CA bundle, the host
// lookup order, and a writable /tmp (the manifests mount an emptyDir there
// when the root file system is read-only).
func baseFiles(ca []byte) []file {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, GID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", GID)
	return []file{
		{path: "etc", mode: 0o755, dir: true},
		{path: "etc/group", mode: 0o644, data: []byte(group)},
		{path: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{path: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{path: "etc/ssl", mode: 0o755, dir: true},
		{path: "etc/ssl/certs", mode: 0o755, dir: true},
		{path: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{path: "home", mode: 0o755, dir: true},
		{path: "home/nonroot", mode: 0o700, dir: true, uid: UID, gid: GID},
		{path: "tmp", mode: 0o1777, dir: true},
		{path: "usr", mode: 0o755, dir: true},
		{path: "usr/local", mode: 0o755, dir: true},
		{path: "usr/local/bin", mode: 0o755, dir: true},
	}
}

// layer writes files as an uncompressed tar layer (as `docker save`
// does: the archive is loaded locally, and a registry push compresses)
// with every time set to mtime, so the same inputs give the same digest.
func layer(mtime time.Time, files []file) (v1.Layer, error) {
	// Sized once: a header block per file, its data in whole blocks, and
	// the two end blocks; growing the buffer copied the commands' tens of
	// megabytes several times over.
	size := 2 * 512
	for _, f := range files {
		size += 512 + (len(f.data)+511)/512*512
	}
	var raw bytes.Buffer
	raw.Grow(size)
	tw := tar.NewWriter(&raw)
	for _, f := range files {
		h := &tar.Header{
			Name: f.path, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: mtime,
			Typeflag: tar.TypeReg, Size: int64(len(f.data)),
		}
		if f.dir {
			h.Name, h.Typeflag, h.Size = f.path+"/", tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return static.NewLayer(raw.Bytes(), types.OCIUncompressedLayer), nil
}
