package imagebuild

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// tagPattern is a valid image tag (the OCI distribution spec's).
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Reference checks repository and tag and returns the image's name. Each
// is checked on its own, so an error blames the one at fault (a tag with a
// colon made the whole name parse as a repository, blamed for the tag's
// characters).
func Reference(repository, tag string) (name.Tag, error) {
	if _, err := name.NewRepository(repository); err != nil {
		return name.Tag{}, fmt.Errorf("image repository %q: %w", repository, err)
	}
	if !tagPattern.MatchString(tag) {
		return name.Tag{}, fmt.Errorf("image tag %q: a tag is 1 to 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'", tag)
	}
	ref, err := name.NewTag(repository + ":" + tag)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image name %s:%s: %w", repository, tag, err)
	}
	return ref, nil
}

// WriteFile writes img as an archive at file under ref; on failure no
// file is left behind.
func WriteFile(file string, ref name.Tag, img v1.Image) (err error) {
	tmp, err := os.CreateTemp(path.Dir(file), ".image-*.tar")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := Write(tmp, ref, img); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), file)
}

// Write writes img under ref as one tar holding an OCI image layout
// (oci-layout, index.json, blobs/sha256/...) and Docker's manifest.json
// pointing at the same blobs, the shape `docker save` writes.
func Write(w io.Writer, ref name.Tag, img v1.Image) error {
	tw := tar.NewWriter(w)
	add := func(name string, data []byte) error {
		// Times are fixed so the archive of one image is always the same.
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	addBlob := func(h v1.Hash, r io.Reader, size int64) error {
		hdr := &tar.Header{Name: blobPath(h), Mode: 0o644, Size: size, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		n, err := io.Copy(tw, r)
		if err == nil && n != size {
			err = fmt.Errorf("blob %s: %d bytes, want %d", h, n, size)
		}
		return err
	}

	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	if err := addBlob(cfgName, bytes.NewReader(cfg), int64(len(cfg))); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var layerPaths []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = addBlob(d, rc, size)
		rc.Close()
		if err != nil {
			return err
		}
		layerPaths = append(layerPaths, blobPath(d))
	}
	raw, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	if err := addBlob(digest, bytes.NewReader(raw), int64(len(raw))); err != nil {
		return err
	}

	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: mt, Digest: digest, Size: int64(len(raw)),
			Annotations: map[string]string{
				// containerd (and so Docker) names the image after this one,
				// OCI tools after the tag in ref.name.
				"io.containerd.image.name":          ref.Name(),
				"org.opencontainers.image.ref.name": ref.TagStr(),
			},
		}},
	})
	if err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	manifest, err := json.Marshal(tarball.Manifest{{
		Config:   blobPath(cfgName),
		RepoTags: []string{ref.String()},
		Layers:   layerPaths,
	}})
	if err != nil {
		return err
	}
	if err := add("manifest.json", manifest); err != nil {
		return err
	}
	return tw.Close()
}

// blobPath is where a blob lives in an OCI image layout.
func blobPath(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }
