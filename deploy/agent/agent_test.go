package agentdeploy

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type container struct {
	Name          string   `yaml:"name"`
	Image         string   `yaml:"image"`
	RestartPolicy string   `yaml:"restartPolicy"`
	Command       []string `yaml:"command"`
	Args          []string `yaml:"args"`
	Env           []struct {
		Name      string `yaml:"name"`
		ValueFrom struct {
			ConfigMapKeyRef struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"configMapKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe   *probe `yaml:"startupProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Security       struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type object struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Template struct {
			Spec struct {
				Security struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
				} `yaml:"securityContext"`
				InitContainers []container `yaml:"initContainers"`
				Containers     []container `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// render renders the kustomization with kubectl, or skips the test.
func render(t *testing.T) []object {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is needed to render the kustomization (`kubectl kustomize`); install kubectl to run this test")
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), kubectl, "kustomize", ".")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, stderr.String())
	}
	var objs []object
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o object
		if err := dec.Decode(&o); err != nil {
			break
		}
		objs = append(objs, o)
	}
	return objs
}

// agentFlags are the flags of the agent binary, from its -h.
func agentFlags(t *testing.T) []string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agent")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/agent")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/agent: %v\n%s", err, out)
	}
	var usage bytes.Buffer
	help := exec.CommandContext(t.Context(), bin, "-h")
	help.Stderr = &usage
	if err := help.Run(); err != nil {
		t.Fatalf("agent -h: %v", err)
	}
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(usage.String(), -1) {
		flags = append(flags, m[1])
	}
	if len(flags) < 5 {
		t.Fatalf("found %v in the agent's usage:\n%s", flags, usage.String())
	}
	return flags
}

// overlayLiteral is key's value in the sluice-env literals of a region
// overlay (or the base).
func overlayLiteral(t *testing.T, dir, key string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("../regions", dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		ConfigMapGenerator []struct {
			Name     string   `yaml:"name"`
			Literals []string `yaml:"literals"`
		} `yaml:"configMapGenerator"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	for _, g := range k.ConfigMapGenerator {
		for _, l := range g.Literals {
			if v, ok := strings.CutPrefix(l, key+"="); ok && g.Name == "sluice-env" {
				return v
			}
		}
	}
	return ""
}

func TestSidecarExample(t *testing.T) {
	objs := render(t)
	var app *object
	env := map[string]string{}
	for i, o := range objs {
		switch {
		case o.Kind == "Deployment" && o.Metadata.Name == "example-app":
			app = &objs[i]
		case o.Kind == "ConfigMap" && strings.HasPrefix(o.Metadata.Name, "sluice-agent-env"):
			env = o.Data
		}
	}
	if app == nil {
		t.Fatal("no example-app Deployment")
	}
	pod := app.Spec.Template.Spec
	i := slices.IndexFunc(pod.InitContainers, func(c container) bool { return c.Name == "sluice-agent" })
	if i < 0 {
		t.Fatal("no sluice-agent init container")
	}
	c := pod.InitContainers[i]
	if c.RestartPolicy != "Always" {
		t.Errorf("sluice-agent restartPolicy %q; want Always (a native sidecar: up before the app, down after it)", c.RestartPolicy)
	}
	if !slices.Equal(c.Command, []string{"/usr/local/bin/agent"}) {
		t.Errorf("command %v; want /usr/local/bin/agent", c.Command)
	}
	if name, tag, ok := strings.Cut(c.Image, ":"); !ok || name != "sluicehq/sluice" || tag == "" || tag == "latest" {
		t.Errorf("image %q; want sluicehq/sluice pinned to a tag", c.Image)
	}

	flags := agentFlags(t)
	args := map[string]string{}
	for _, a := range c.Args {
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !slices.Contains(flags, name) {
			t.Errorf("arg %q: the agent has no flag %q", a, name)
		}
		args[name] = value
	}
	for _, e := range c.Env {
		name := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(e.Name, "SLUICE_")), "_", "-")
		if !strings.HasPrefix(e.Name, "SLUICE_") || !slices.Contains(flags, name) {
			t.Errorf("env %s sets no flag of the agent", e.Name)
		}
		if ref := e.ValueFrom.ConfigMapKeyRef; ref.Key != "" {
			if _, ok := env[ref.Key]; !ok || !strings.HasPrefix(ref.Name, "sluice-agent-env") {
				t.Errorf("env %s reads %s/%s, which the kustomization does not generate", e.Name, ref.Name, ref.Key)
			}
		}
	}
	for _, f := range []string{"listen", "http-listen"} {
		host, _, err := net.SplitHostPort(args[f])
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("-%s=%q: the APIs serve this pod only and must listen on loopback", f, args[f])
		}
	}

	// The region's headless Service, in the region's namespace, and the
	// region's own etcd.
	if got, want := env["region-addr"], "dns:///sluice-regional-headless.sluice-us-east.svc:7400"; got != want {
		t.Errorf("region-addr %q; want %q", got, want)
	}
	if svc, err := os.ReadFile("../regions/base/regional-service.yaml"); err != nil || !bytes.Contains(svc, []byte("name: sluice-regional-headless")) {
		t.Errorf("the regional manifests define no sluice-regional-headless Service (%v)", err)
	}
	if got, want := env["region"], overlayLiteral(t, "us-east", "region"); got != want || want == "" {
		t.Errorf("region %q; want the region's %q, as its regional service names it", got, want)
	}
	if got, want := env["etcd-endpoints"], overlayLiteral(t, "us-east", "etcd-endpoints"); got != want || want == "" {
		t.Errorf("etcd-endpoints %q; want the region's %q", got, want)
	}
	if got, want := env["etcd-prefix"], overlayLiteral(t, "base", "etcd-prefix"); got != want || want == "" {
		t.Errorf("etcd-prefix %q; want the region's %q", got, want)
	}

	metricsPort := ""
	for _, p := range c.Ports {
		if _, port, _ := net.SplitHostPort(args["metrics-listen"]); port != "" && p.ContainerPort > 0 && port == strconv.Itoa(p.ContainerPort) {
			metricsPort = p.Name
		}
	}
	for name, p := range map[string]*probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port != metricsPort || metricsPort == "" {
			t.Errorf("%s probe %+v: want an HTTP probe on the -metrics-listen port", name, p)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/livez" {
		t.Errorf("liveness probe path %q; want /livez (not /healthz: a missing config is no reason to restart)", c.LivenessProbe.HTTPGet.Path)
	}
	if !pod.Security.RunAsNonRoot || !c.Security.ReadOnlyRootFilesystem || c.Security.AllowPrivilegeEscalation == nil ||
		*c.Security.AllowPrivilegeEscalation || !slices.Contains(c.Security.Capabilities.Drop, "ALL") {
		t.Errorf("sidecar security: pod runAsNonRoot %v, container %+v; want non-root, read-only root, no escalation, all capabilities dropped",
			pod.Security.RunAsNonRoot, c.Security)
	}
}
