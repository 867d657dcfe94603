// Command imagebuild writes Sluice's container image as a tar that
// `docker load` and `podman load` read, without a container daemon (see
// internal/imagebuild). `make image` runs it:
//
//	go run ./scripts/imagebuild [-bin DIR] [-o FILE] [-image NAME] [-tag TAG] [-ca-bundle FILE]
//
// Without -bin it first builds every command (static, for linux) into
// bin/image/. The tag defaults to the binaries' module version.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/sluicehq/sluice/internal/imagebuild"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return
		}
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("imagebuild", flag.ContinueOnError)
	bin := fs.String("bin", "", "directory of already built static linux binaries (default: build every command into bin/image)")
	out := fs.String("o", "bin/sluice-image.tar", "archive to write")
	repo := fs.String("image", imagebuild.Repository, "image repository name")
	tag := fs.String("tag", "", "image tag (default: the binaries' module version, e.g. 0.2.0)")
	ca := fs.String("ca-bundle", imagebuild.DefaultCABundle, "PEM CA bundle to put in the image")
	goarch := fs.String("goarch", runtime.GOARCH, "architecture to build for (without -bin)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *bin == "" {
		*bin = filepath.Join("bin", "image")
		if err := os.RemoveAll(*bin); err != nil {
			return err
		}
		if err := os.MkdirAll(*bin, 0o755); err != nil {
			return err
		}
		if err := imagebuild.BuildBinaries(ctx, "go", ".", *bin, *goarch); err != nil {
			return err
		}
	}
	res, err := imagebuild.Build(*bin, *ca)
	if err != nil {
		return err
	}
	if *tag == "" {
		*tag = res.Tag
	}
	ref, err := imagebuild.Reference(*repo, *tag)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	if err := imagebuild.WriteFile(*out, ref, res.Image); err != nil {
		return err
	}
	digest, err := res.Image.Digest()
	if err != nil {
		return err
	}
	var names []string
	for _, b := range res.Binaries {
		names = append(names, b.Name)
	}
	// The manifest digest is this tarball's: its layers are uncompressed,
	// and every push compresses them, so a registry holds the image under
	// another digest, the one the push prints.
	fmt.Printf(`wrote %[1]s
  image    %[2]s
  local    %[3]s
           (this tarball's manifest, layers uncompressed: it identifies the tarball;
           a registry holds the pushed image under another digest, which the push prints)
  commands %[4]s (in %[5]s, entrypoint %[6]s, user %[7]s)
  version  %[8]s, revision %[9]s

load it:    docker load -i %[1]s    (or: podman load -i %[1]s)
push it:    crane push %[1]s REGISTRY/sluice:%[10]s
            (prints REGISTRY/sluice@sha256:..., the registry's digest; or docker load, then
            docker tag %[2]s REGISTRY/sluice:%[10]s && docker push REGISTRY/sluice:%[10]s,
            which prints "digest: sha256:..."; later: crane digest REGISTRY/sluice:%[10]s)
deploy it:  cd deploy/regions/REGION && kustomize edit set image %[11]s=REGISTRY/sluice@sha256:...
            with the registry's digest (or =REGISTRY/sluice:%[10]s; sets the images: entry of
            that overlay's kustomization.yaml)
`, *out, ref.String(), digest, strings.Join(names, ", "), imagebuild.BinDir, strings.Join(imagebuild.Entrypoint, " "),
		imagebuild.User, res.Info.Version, orNone(res.Info.Revision), *tag, imagebuild.Repository)
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
