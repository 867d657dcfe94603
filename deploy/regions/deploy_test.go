package regions

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/config"
)

const (
	image         = "sluicehq/sluice"
	regionalName  = "sluice-regional"
	globalName    = "sluice-global"
	regionalGRPC  = 7400
	regionalHTTP  = 7401
	globalGRPC    = 7500
	globalHTTP    = 7501
	globalReplica = 3
	// podIPMarker stands for the value the downward API fills in.
	podIPMarker = "<status.podIP>"
	// secretMarker prefixes values that come from a Secret at run time.
	secretMarker = "<secret>"
)

// regionalFlags and globalFlags are the daemons' flags; a SLUICE_*
// variable naming anything else is silently ignored by the daemon, so the
// manifests must not rely on one.
func regionalFlags() []string {
	return []string{"region", "listen", "metrics-listen", "redis-addr", "redis-cluster", "redis-username", "redis-password", "config",
		"etcd-endpoints", "etcd-prefix", "global-addr", "session-ttl", "cold-start", "log-level", "envoy-headers",
		"tls-cert", "tls-key", "tls-client-ca", "tls-ca", "global-tls-name", "etcd-cert", "etcd-key", "etcd-ca", "etcd-username", "etcd-password",
		"max-inflight-per-connection", "max-inflight-per-identity"}
}

func globalFlags() []string {
	return []string{"listen", "metrics-listen", "advertise", "shard", "etcd-endpoints", "etcd-prefix", "config", "log-level",
		"tls-cert", "tls-key", "tls-client-ca", "etcd-cert", "etcd-key", "etcd-ca", "etcd-username", "etcd-password",
		"max-inflight-per-connection", "max-inflight-per-identity"}
}

// ---- rendering and decoding ----

// kustomize renders dir with kubectl, or skips the test without kubectl.
func kustomize(t *testing.T, dir string) []byte {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is needed to render the kustomize overlays (`kubectl kustomize`); install kubectl to run these tests")
	}
	cmd := exec.CommandContext(t.Context(), kubectl, "kustomize", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	return out
}

type objectMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type header struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
}

// intOrString holds a Kubernetes IntOrString (a port number or name).
type intOrString string

func (s *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a number or a name", n.Line)
	}
	*s = intOrString(n.Value)
	return nil
}

type labelSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions []yaml.Node       `yaml:"matchExpressions"`
}

// selects reports whether the selector picks pods labelled labels. Only
// matchLabels selectors are supported; the manifests use nothing else.
func (s labelSelector) selects(labels map[string]string) bool {
	if len(s.MatchLabels) == 0 || len(s.MatchExpressions) > 0 {
		return false
	}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

type keyRef struct {
	Name     string `yaml:"name"`
	Key      string `yaml:"key"`
	Optional *bool  `yaml:"optional"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		ConfigMapKeyRef *keyRef `yaml:"configMapKeyRef"`
		SecretKeyRef    *keyRef `yaml:"secretKeyRef"`
		FieldRef        *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type envFrom struct {
	Prefix       string  `yaml:"prefix"`
	ConfigMapRef *keyRef `yaml:"configMapRef"`
	SecretRef    *keyRef `yaml:"secretRef"`
}

type probe struct {
	GRPC *struct {
		Port    int     `yaml:"port"`
		Service *string `yaml:"service"`
	} `yaml:"grpc"`
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port intOrString `yaml:"port"`
	} `yaml:"tcpSocket"`
	Exec *struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type volumeMount struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
	SubPath   string `yaml:"subPath"`
}

type container struct {
	Name           string          `yaml:"name"`
	Image          string          `yaml:"image"`
	Command        []string        `yaml:"command"`
	Args           []string        `yaml:"args"`
	Env            []envVar        `yaml:"env"`
	EnvFrom        []envFrom       `yaml:"envFrom"`
	Ports          []containerPort `yaml:"ports"`
	ReadinessProbe *probe          `yaml:"readinessProbe"`
	LivenessProbe  *probe          `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	VolumeMounts []volumeMount `yaml:"volumeMounts"`
}

type keyToPath struct {
	Key  string `yaml:"key"`
	Path string `yaml:"path"`
}

type volume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name  string      `yaml:"name"`
		Items []keyToPath `yaml:"items"`
	} `yaml:"configMap"`
	Secret *struct {
		SecretName string      `yaml:"secretName"`
		Items      []keyToPath `yaml:"items"`
	} `yaml:"secret"`
}

type podSpec struct {
	ServiceAccountName           string `yaml:"serviceAccountName"`
	AutomountServiceAccountToken *bool  `yaml:"automountServiceAccountToken"`
	SecurityContext              struct {
		RunAsNonRoot   *bool `yaml:"runAsNonRoot"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	TopologySpreadConstraints []struct {
		TopologyKey   string        `yaml:"topologyKey"`
		LabelSelector labelSelector `yaml:"labelSelector"`
	} `yaml:"topologySpreadConstraints"`
	Containers []container `yaml:"containers"`
	Volumes    []volume    `yaml:"volumes"`
}

type deploymentObj struct {
	header `yaml:",inline"`
	Spec   struct {
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template struct {
			Metadata objectMeta `yaml:"metadata"`
			Spec     podSpec    `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type serviceObj struct {
	header `yaml:",inline"`
	Spec   struct {
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []struct {
			Name       string      `yaml:"name"`
			Port       int         `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type pdbObj struct {
	header `yaml:",inline"`
	Spec   struct {
		MinAvailable   *intOrString  `yaml:"minAvailable"`
		MaxUnavailable *intOrString  `yaml:"maxUnavailable"`
		Selector       labelSelector `yaml:"selector"`
	} `yaml:"spec"`
}

type hpaObj struct {
	header `yaml:",inline"`
	Spec   struct {
		ScaleTargetRef struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Name       string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicas *int `yaml:"minReplicas"`
		MaxReplicas int  `yaml:"maxReplicas"`
		Metrics     []struct {
			Type     string `yaml:"type"`
			Resource *struct {
				Name   string `yaml:"name"`
				Target struct {
					Type               string `yaml:"type"`
					AverageUtilization *int   `yaml:"averageUtilization"`
				} `yaml:"target"`
			} `yaml:"resource"`
		} `yaml:"metrics"`
	} `yaml:"spec"`
}

type configMapObj struct {
	header `yaml:",inline"`
	Data   map[string]string `yaml:"data"`
}

// rendered is one overlay's output, decoded. Tests mutate it to prove the
// checks catch mistakes.
type rendered struct {
	objects     []*header
	deployments []*deploymentObj
	services    []*serviceObj
	pdbs        []*pdbObj
	hpas        []*hpaObj
	configMaps  []*configMapObj
}

func decode(out []byte) (*rendered, error) {
	r := &rendered{}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decode rendered YAML: %w", err)
		}
		if len(doc.Content) == 0 {
			continue
		}
		var h header
		if err := doc.Decode(&h); err != nil {
			return nil, fmt.Errorf("decode object at line %d: %w", doc.Line, err)
		}
		r.objects = append(r.objects, &h)
		var err error
		switch h.Kind {
		case "Deployment":
			err = decodeInto(&doc, &r.deployments)
		case "Service":
			err = decodeInto(&doc, &r.services)
		case "PodDisruptionBudget":
			err = decodeInto(&doc, &r.pdbs)
		case "HorizontalPodAutoscaler":
			err = decodeInto(&doc, &r.hpas)
		case "ConfigMap":
			err = decodeInto(&doc, &r.configMaps)
		}
		if err != nil {
			return nil, fmt.Errorf("decode %s %s: %w", h.Kind, h.Metadata.Name, err)
		}
	}
	return r, nil
}

func decodeInto[T any](doc *yaml.Node, into *[]*T) error {
	v := new(T)
	if err := doc.Decode(v); err != nil {
		return err
	}
	*into = append(*into, v)
	return nil
}

func find[T any](objs []*T, name func(*T) string, want string) *T {
	for _, o := range objs {
		if name(o) == want {
			return o
		}
	}
	return nil
}

func (r *rendered) deployment(name string) *deploymentObj {
	return find(r.deployments, func(d *deploymentObj) string { return d.Metadata.Name }, name)
}

func (r *rendered) service(name string) *serviceObj {
	return find(r.services, func(s *serviceObj) string { return s.Metadata.Name }, name)
}

func (r *rendered) configMap(name string) *configMapObj {
	return find(r.configMaps, func(c *configMapObj) string { return c.Metadata.Name }, name)
}

// ---- checks ----

type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// podFlags is what the daemon in c would parse: SLUICE_* variables
// resolved against the rendered ConfigMaps, then the command line, which
// wins. Secret values are secretMarker; downward-API values name their
// field in angle brackets.
func podFlags(r *rendered, c container, p *problems) map[string]string {
	env := map[string]string{}
	var order []string
	set := func(name, value string) {
		if _, ok := env[name]; !ok {
			order = append(order, name)
		}
		env[name] = value
	}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm := r.configMap(ef.ConfigMapRef.Name)
			if cm == nil {
				if ef.ConfigMapRef.Optional == nil || !*ef.ConfigMapRef.Optional {
					p.addf("container %s: envFrom ConfigMap %q is not rendered", c.Name, ef.ConfigMapRef.Name)
				}
				continue
			}
			for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
				set(ef.Prefix+k, cm.Data[k])
			}
		case ef.SecretRef != nil:
			p.addf("container %s: envFrom Secret %q: name the keys one by one so each flag's source is visible", c.Name, ef.SecretRef.Name)
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			set(e.Name, expand(e.Value, env))
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := r.configMap(ref.Name)
			v, ok := "", false
			if cm != nil {
				v, ok = cm.Data[ref.Key]
			}
			if !ok {
				if ref.Optional == nil || !*ref.Optional {
					p.addf("container %s: env %s: ConfigMap %q has no key %q, so the pod cannot start", c.Name, e.Name, ref.Name, ref.Key)
				}
				continue
			}
			set(e.Name, v)
		case e.ValueFrom.SecretKeyRef != nil:
			set(e.Name, secretMarker)
		case e.ValueFrom.FieldRef != nil:
			set(e.Name, "<"+e.ValueFrom.FieldRef.FieldPath+">")
		default:
			p.addf("container %s: env %s: unsupported valueFrom", c.Name, e.Name)
		}
	}

	flags := map[string]string{}
	for _, name := range order {
		if f, ok := strings.CutPrefix(name, "SLUICE_"); ok {
			flags[strings.ReplaceAll(strings.ToLower(f), "_", "-")] = env[name]
		}
	}
	for i := 0; i < len(c.Args); i++ {
		a := c.Args[i]
		name, ok := strings.CutPrefix(a, "-")
		if !ok {
			p.addf("container %s: argument %q is not a flag", c.Name, a)
			continue
		}
		name = strings.TrimPrefix(name, "-")
		name, value, hasValue := strings.Cut(name, "=")
		if !hasValue {
			if i+1 >= len(c.Args) {
				p.addf("container %s: flag -%s has no value", c.Name, name)
				continue
			}
			i++
			value = c.Args[i]
		}
		flags[name] = expand(value, env)
	}
	return flags
}

// expand substitutes $(VAR) the way the kubelet does for args and env.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "$(")
		if i < 0 {
			return b.String() + s
		}
		j := strings.Index(s[i:], ")")
		if j < 0 {
			return b.String() + s
		}
		name := s[i+2 : i+j]
		b.WriteString(s[:i])
		if v, ok := env[name]; ok {
			b.WriteString(v)
		} else {
			b.WriteString(s[i : i+j+1])
		}
		s = s[i+j+1:]
	}
}

func listenPort(addr string) (int, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(port)
}

func checkHostPort(p *problems, what, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		p.addf("%s %q: %v", what, addr, err)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		p.addf("%s %q: port %q is not a TCP port", what, addr, port)
	}
	if host == "" {
		p.addf("%s %q: no host", what, addr)
	}
}

// portNumber resolves a numbered or named port against the container.
func portNumber(c container, port intOrString) int {
	if n, err := strconv.Atoi(string(port)); err == nil {
		return n
	}
	for _, cp := range c.Ports {
		if cp.Name == string(port) {
			return cp.ContainerPort
		}
	}
	return 0
}

// mountedFile finds the volume and key behind the file at filePath.
func mountedFile(spec podSpec, c container, filePath string) (volume, string, bool) {
	for _, m := range c.VolumeMounts {
		var key string
		switch {
		case m.SubPath != "" && m.MountPath == filePath:
			key = m.SubPath
		case m.SubPath == "" && m.MountPath == path.Dir(filePath):
			key = path.Base(filePath)
		default:
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var items []keyToPath
			switch {
			case v.ConfigMap != nil:
				items = v.ConfigMap.Items
			case v.Secret != nil:
				items = v.Secret.Items
			}
			if len(items) > 0 {
				i := slices.IndexFunc(items, func(it keyToPath) bool { return it.Path == key })
				if i < 0 {
					return volume{}, "", false
				}
				key = items[i].Key
			}
			return v, key, true
		}
	}
	return volume{}, "", false
}

type podWant struct {
	component   string // app.kubernetes.io/component
	binary      string
	grpcPort    int
	metricsPort int
	knownFlags  []string
}

// checkPod checks what both daemons' Deployments share and returns the
// flags the daemon would run with and its bootstrap config text.
func checkPod(r *rendered, d *deploymentObj, w podWant, p *problems) (map[string]string, string) {
	name := d.Metadata.Name
	tmpl := d.Spec.Template
	spec := tmpl.Spec
	if tmpl.Metadata.Labels["app.kubernetes.io/component"] != w.component {
		p.addf("Deployment %s: pod label app.kubernetes.io/component = %q, want %q", name, tmpl.Metadata.Labels["app.kubernetes.io/component"], w.component)
	}
	if !d.Spec.Selector.selects(tmpl.Metadata.Labels) {
		p.addf("Deployment %s: selector %v does not match its pod labels %v", name, d.Spec.Selector.MatchLabels, tmpl.Metadata.Labels)
	}
	if len(spec.Containers) != 1 {
		p.addf("Deployment %s: %d containers, want 1", name, len(spec.Containers))
		return map[string]string{}, ""
	}
	c := spec.Containers[0]

	tag, digest := "", ""
	if rest, ok := strings.CutPrefix(c.Image, image+"@"); ok {
		digest = rest
	} else if rest, ok := strings.CutPrefix(c.Image, image+":"); ok {
		tag = rest
	}
	switch {
	case digest == "" && tag == "":
		p.addf("Deployment %s: image %q is not %s pinned to a tag or digest", name, c.Image, image)
	case tag == "latest":
		p.addf("Deployment %s: image %q: pin a release, not latest", name, c.Image)
	}
	if want := []string{"/usr/local/bin/" + w.binary}; !slices.Equal(c.Command, want) {
		p.addf("Deployment %s: command %q, want %q", name, c.Command, want)
	}

	ports := map[string]int{}
	for _, cp := range c.Ports {
		ports[cp.Name] = cp.ContainerPort
	}
	if ports["grpc"] != w.grpcPort || ports["metrics"] != w.metricsPort {
		p.addf("Deployment %s: container ports %v, want grpc=%d metrics=%d", name, ports, w.grpcPort, w.metricsPort)
	}

	flags := podFlags(r, c, p)
	for f := range flags {
		if !slices.Contains(w.knownFlags, f) {
			p.addf("Deployment %s: %s has no flag -%s (set through SLUICE_%s or an argument); it would be ignored or rejected",
				name, w.binary, f, strings.ToUpper(strings.ReplaceAll(f, "-", "_")))
		}
	}
	if port, err := listenPort(flags["listen"]); err != nil || port != w.grpcPort {
		p.addf("Deployment %s: -listen %q must listen on the grpc port %d", name, flags["listen"], w.grpcPort)
	}
	if port, err := listenPort(flags["metrics-listen"]); err != nil || port != w.metricsPort {
		p.addf("Deployment %s: -metrics-listen %q must listen on the metrics port %d", name, flags["metrics-listen"], w.metricsPort)
	}
	for _, f := range []string{"redis-password", "etcd-password"} {
		if v, ok := flags[f]; ok && v != secretMarker {
			p.addf("Deployment %s: -%s must come from a Secret, not the manifest", name, f)
		}
	}
	for _, e := range c.Env {
		if strings.Contains(e.Name, "PASSWORD") && e.ValueFrom == nil {
			p.addf("Deployment %s: env %s holds a password in plain text", name, e.Name)
		}
	}

	// TLS files must come from mounted Secrets; the kubelet's gRPC probe
	// cannot speak TLS, so with TLS readiness moves to HTTP /healthz.
	tls := flags["tls-cert"] != ""
	if tls != (flags["tls-key"] != "") {
		p.addf("Deployment %s: -tls-cert and -tls-key go together (got %q, %q)", name, flags["tls-cert"], flags["tls-key"])
	}
	if flags["tls-client-ca"] != "" && !tls {
		p.addf("Deployment %s: -tls-client-ca without -tls-cert", name)
	}
	for _, f := range []string{"tls-cert", "tls-key", "tls-client-ca", "etcd-cert", "etcd-key", "etcd-ca"} {
		if flags[f] == "" {
			continue
		}
		if v, _, ok := mountedFile(spec, c, flags[f]); !ok || v.Secret == nil {
			p.addf("Deployment %s: -%s %q is not a file of a mounted Secret", name, f, flags[f])
		}
	}
	switch rp := c.ReadinessProbe; {
	case rp == nil:
		p.addf("Deployment %s: no readiness probe", name)
	case !tls && (rp.GRPC == nil || rp.GRPC.Port != w.grpcPort):
		p.addf("Deployment %s: readiness must be the gRPC health probe on port %d", name, w.grpcPort)
	case tls && (rp.HTTPGet == nil || rp.HTTPGet.Path != "/healthz" || portNumber(c, rp.HTTPGet.Port) != w.metricsPort):
		p.addf("Deployment %s: with TLS, readiness must be HTTP /healthz on the metrics port %d (the gRPC probe speaks plaintext)", name, w.metricsPort)
	}
	// /healthz and gRPC health follow Redis and etcd; restarting a pod
	// cannot fix either, so liveness must not use them.
	switch lp := c.LivenessProbe; {
	case lp == nil:
		p.addf("Deployment %s: no liveness probe", name)
	case lp.GRPC != nil || (lp.HTTPGet != nil && lp.HTTPGet.Path == "/healthz"):
		p.addf("Deployment %s: liveness must not follow gRPC health or /healthz, which fail when Redis or etcd do", name)
	case lp.HTTPGet != nil && portNumber(c, lp.HTTPGet.Port) != w.metricsPort:
		p.addf("Deployment %s: liveness HTTP port %q is not the metrics port %d", name, lp.HTTPGet.Port, w.metricsPort)
	case lp.HTTPGet == nil || lp.HTTPGet.Path != "/livez":
		p.addf("Deployment %s: liveness must be HTTP /livez (the daemons' process-alive endpoint)", name)
	}

	configText := ""
	if cfgPath := flags["config"]; cfgPath == "" {
		p.addf("Deployment %s: no -config: the bootstrap config is not passed", name)
	} else if v, key, ok := mountedFile(spec, c, cfgPath); !ok || v.ConfigMap == nil {
		p.addf("Deployment %s: -config %q is not a file of a mounted ConfigMap", name, cfgPath)
	} else if cm := r.configMap(v.ConfigMap.Name); cm == nil {
		p.addf("Deployment %s: config ConfigMap %q is not rendered", name, v.ConfigMap.Name)
	} else if text, ok := cm.Data[key]; !ok {
		p.addf("Deployment %s: ConfigMap %s has no key %q for -config", name, cm.Metadata.Name, key)
	} else if _, err := config.Parse([]byte(text)); err != nil {
		p.addf("Deployment %s: bootstrap config in ConfigMap %s: %v", name, cm.Metadata.Name, err)
	} else {
		configText = text
	}

	sc := c.SecurityContext
	if !(isTrue(spec.SecurityContext.RunAsNonRoot) || isTrue(sc.RunAsNonRoot)) {
		p.addf("Deployment %s: runAsNonRoot is not set", name)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		p.addf("Deployment %s: readOnlyRootFilesystem is not set", name)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		p.addf("Deployment %s: allowPrivilegeEscalation must be false", name)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		p.addf("Deployment %s: capabilities must drop ALL (drop %v)", name, sc.Capabilities.Drop)
	}
	if spec.SecurityContext.SeccompProfile.Type != "RuntimeDefault" && sc.SeccompProfile.Type != "RuntimeDefault" {
		p.addf("Deployment %s: seccompProfile must be RuntimeDefault", name)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		p.addf("Deployment %s: the daemons never call the Kubernetes API; set automountServiceAccountToken: false", name)
	}
	for _, res := range []string{"cpu", "memory"} {
		if c.Resources.Requests[res] == "" {
			p.addf("Deployment %s: no %s request", name, res)
		}
	}
	if c.Resources.Limits["memory"] == "" {
		p.addf("Deployment %s: no memory limit", name)
	}

	ann := tmpl.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(w.metricsPort) || ann["prometheus.io/path"] != "/metrics" {
		p.addf("Deployment %s: prometheus annotations %v, want scrape=true port=%d path=/metrics", name, ann, w.metricsPort)
	}
	spread := false
	for _, tsc := range spec.TopologySpreadConstraints {
		if !tsc.LabelSelector.selects(tmpl.Metadata.Labels) {
			p.addf("Deployment %s: topology spread on %s selects %v, not its own pods", name, tsc.TopologyKey, tsc.LabelSelector.MatchLabels)
		}
		spread = spread || tsc.TopologyKey == "kubernetes.io/hostname"
	}
	if v := flags["log-level"]; !slices.Contains([]string{"", "debug", "info", "warn", "error"}, v) {
		p.addf("Deployment %s: -log-level %q: want debug, info, warn or error", name, v)
	}
	if !spread {
		p.addf("Deployment %s: replicas are not spread over nodes (no kubernetes.io/hostname topology spread)", name)
	}

	svc := r.service(name)
	if svc == nil {
		p.addf("Deployment %s: no Service %s", name, name)
	} else {
		if svc.Spec.Selector == nil || !(labelSelector{MatchLabels: svc.Spec.Selector}).selects(tmpl.Metadata.Labels) {
			p.addf("Service %s: selector %v does not match the pods of Deployment %s", name, svc.Spec.Selector, name)
		}
		got := map[string]int{}
		for _, sp := range svc.Spec.Ports {
			if portNumber(c, sp.TargetPort) != sp.Port {
				p.addf("Service %s: port %s %d targets %q, not container port %d", name, sp.Name, sp.Port, sp.TargetPort, sp.Port)
			}
			got[sp.Name] = sp.Port
		}
		if got["grpc"] != w.grpcPort || got["metrics"] != w.metricsPort {
			p.addf("Service %s: ports %v, want grpc=%d metrics=%d", name, got, w.grpcPort, w.metricsPort)
		}
	}

	budgeted := 0
	for _, pdb := range r.pdbs {
		if !pdb.Spec.Selector.selects(tmpl.Metadata.Labels) {
			continue
		}
		budgeted++
		if pdb.APIVersion != "policy/v1" {
			p.addf("PodDisruptionBudget %s: apiVersion %s, want policy/v1", pdb.Metadata.Name, pdb.APIVersion)
		}
		if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
			p.addf("PodDisruptionBudget %s: set exactly one of minAvailable and maxUnavailable", pdb.Metadata.Name)
		}
	}
	if budgeted != 1 {
		p.addf("Deployment %s: %d PodDisruptionBudgets select its pods, want 1", name, budgeted)
	}
	return flags, configText
}

func isTrue(b *bool) bool { return b != nil && *b }

// overlaySummary is what the fleet-wide checks compare across regions.
type overlaySummary struct {
	region        string
	config        string
	redisAddr     string
	etcdEndpoints []string
	etcdPrefix    string
	globalAddr    string
	// globalNamespace and globalPort are set when the overlay runs the
	// global allocator.
	globalNamespace string
	globalPort      int
}

// checkOverlay checks one region's rendered manifests.
func checkOverlay(r *rendered, region string) (overlaySummary, problems) {
	var p problems
	s := overlaySummary{region: region}
	namespace := "sluice-" + region

	hasNamespace := false
	for _, o := range r.objects {
		id := o.Kind + " " + o.Metadata.Name
		if o.Kind == "Namespace" {
			hasNamespace = hasNamespace || o.Metadata.Name == namespace
			continue
		}
		if o.Metadata.Namespace != namespace {
			p.addf("%s: namespace %q, want %q", id, o.Metadata.Namespace, namespace)
		}
		if o.Metadata.Labels["app.kubernetes.io/part-of"] != "sluice" {
			p.addf("%s: no label app.kubernetes.io/part-of=sluice", id)
		}
	}
	if !hasNamespace {
		p.addf("no Namespace %s is rendered", namespace)
	}

	rd := r.deployment(regionalName)
	if rd == nil {
		p.addf("no Deployment %s", regionalName)
		return s, p
	}
	flags, cfgText := checkPod(r, rd, podWant{
		component: "regional", binary: "regional", grpcPort: regionalGRPC, metricsPort: regionalHTTP, knownFlags: regionalFlags(),
	}, &p)
	s.config = cfgText
	if flags["region"] != region {
		p.addf("Deployment %s: -region %q, want %q (the overlay's region)", regionalName, flags["region"], region)
	}
	if cfgText != "" {
		cfg, _ := config.Parse([]byte(cfgText))
		if _, ok := cfg.Regions[region]; !ok {
			p.addf("bootstrap config: regions %v do not include %q", slices.Sorted(maps.Keys(cfg.Regions)), region)
		}
	}
	s.redisAddr = flags["redis-addr"]
	checkHostPort(&p, "-redis-addr", s.redisAddr)
	s.globalAddr = flags["global-addr"]
	checkHostPort(&p, "-global-addr", s.globalAddr)
	s.etcdPrefix = flags["etcd-prefix"]
	if !strings.HasPrefix(s.etcdPrefix, "/") {
		p.addf("-etcd-prefix %q: want an absolute key prefix like /sluice", s.etcdPrefix)
	}
	s.etcdEndpoints = checkEtcd(&p, regionalName, flags)
	if v := flags["cold-start"]; v != "" && v != "conservative" && v != "full" {
		p.addf("-cold-start %q: want conservative or full", v)
	}
	checkAutoscaler(r, rd, &p)

	if gd := r.deployment(globalName); gd != nil {
		gflags, gcfg := checkPod(r, gd, podWant{
			component: "global", binary: "global", grpcPort: globalGRPC, metricsPort: globalHTTP, knownFlags: globalFlags(),
		}, &p)
		if gd.Spec.Replicas == nil || *gd.Spec.Replicas != globalReplica {
			p.addf("Deployment %s: replicas %v, want %d (a leader and two standbys)", globalName, deref(gd.Spec.Replicas), globalReplica)
		}
		if want := podIPMarker + ":" + strconv.Itoa(globalGRPC); gflags["advertise"] != want {
			p.addf("Deployment %s: -advertise %q, want the pod's own IP and gRPC port (%s)", globalName, gflags["advertise"], want)
		}
		if gcfg != cfgText {
			p.addf("Deployment %s runs a different bootstrap config from %s", globalName, regionalName)
		}
		if gflags["etcd-prefix"] != s.etcdPrefix || !slices.Equal(checkEtcd(&p, globalName, gflags), s.etcdEndpoints) {
			p.addf("Deployment %s: etcd %q%s differs from the regional service's %q%s",
				globalName, gflags["etcd-endpoints"], gflags["etcd-prefix"], flags["etcd-endpoints"], s.etcdPrefix)
		}
		for _, h := range r.hpas {
			if h.Spec.ScaleTargetRef.Name == globalName {
				p.addf("HorizontalPodAutoscaler %s scales %s; only the leader works, keep it at %d", h.Metadata.Name, globalName, globalReplica)
			}
		}
		if svc := r.service(globalName); svc != nil {
			s.globalNamespace = svc.Metadata.Namespace
			for _, sp := range svc.Spec.Ports {
				if sp.Name == "grpc" {
					s.globalPort = sp.Port
				}
			}
		}
	}
	return s, p
}

func deref(n *int) any {
	if n == nil {
		return "unset"
	}
	return *n
}

// checkEtcd checks -etcd-endpoints and returns the endpoints sorted.
func checkEtcd(p *problems, name string, flags map[string]string) []string {
	raw := flags["etcd-endpoints"]
	if raw == "" {
		p.addf("Deployment %s: no -etcd-endpoints", name)
		return nil
	}
	var eps []string
	schemes := map[string]bool{}
	for ep := range strings.SplitSeq(raw, ",") {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
			p.addf("Deployment %s: etcd endpoint %q: want http(s)://host:port", name, ep)
			continue
		}
		schemes[u.Scheme] = true
		eps = append(eps, ep)
	}
	if len(schemes) > 1 {
		p.addf("Deployment %s: etcd endpoints mix http and https: %s", name, raw)
	}
	if schemes["https"] != (flags["etcd-ca"] != "") {
		p.addf("Deployment %s: https etcd endpoints and -etcd-ca go together (endpoints %s, -etcd-ca %q)", name, raw, flags["etcd-ca"])
	}
	slices.Sort(eps)
	return eps
}

func checkAutoscaler(r *rendered, rd *deploymentObj, p *problems) {
	var hpa *hpaObj
	for _, h := range r.hpas {
		if h.Spec.ScaleTargetRef.Name == regionalName {
			hpa = h
		}
	}
	if hpa == nil {
		p.addf("no HorizontalPodAutoscaler targets Deployment %s", regionalName)
		return
	}
	ref := hpa.Spec.ScaleTargetRef
	if hpa.APIVersion != "autoscaling/v2" || ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" {
		p.addf("HorizontalPodAutoscaler %s: %s targeting %s %s, want autoscaling/v2 targeting apps/v1 Deployment",
			hpa.Metadata.Name, hpa.APIVersion, ref.APIVersion, ref.Kind)
	}
	cpu := false
	for _, m := range hpa.Spec.Metrics {
		cpu = cpu || (m.Type == "Resource" && m.Resource != nil && m.Resource.Name == "cpu" && m.Resource.Target.AverageUtilization != nil)
	}
	if !cpu {
		p.addf("HorizontalPodAutoscaler %s: no CPU utilization metric", hpa.Metadata.Name)
	}
	lo := 1
	if hpa.Spec.MinReplicas != nil {
		lo = *hpa.Spec.MinReplicas
	}
	if lo < 2 {
		p.addf("HorizontalPodAutoscaler %s: minReplicas %d; one replica means an outage on every drain", hpa.Metadata.Name, lo)
	}
	if hpa.Spec.MaxReplicas < lo {
		p.addf("HorizontalPodAutoscaler %s: maxReplicas %d < minReplicas %d", hpa.Metadata.Name, hpa.Spec.MaxReplicas, lo)
	}
	if n := rd.Spec.Replicas; n == nil || *n < lo || *n > hpa.Spec.MaxReplicas {
		p.addf("Deployment %s: replicas %v outside the autoscaler's [%d, %d]", regionalName, deref(n), lo, hpa.Spec.MaxReplicas)
	}
}

// checkFleet checks what must agree across regions. baseConfig is the
// base's sluice.yaml, the reference copy.
func checkFleet(summaries []overlaySummary, baseConfig string) problems {
	var p problems
	regions := make([]string, 0, len(summaries))
	var hosts []overlaySummary
	redis := map[string]string{}
	for _, s := range summaries {
		regions = append(regions, s.region)
		if s.globalPort != 0 {
			hosts = append(hosts, s)
		}
		if other, dup := redis[s.redisAddr]; dup {
			p.addf("regions %s and %s share Redis %s; each region keeps its buckets in its own Redis", other, s.region, s.redisAddr)
		}
		redis[s.redisAddr] = s.region
	}
	slices.Sort(regions)

	if len(hosts) != 1 {
		names := make([]string, len(hosts))
		for i, h := range hosts {
			names[i] = h.region
		}
		p.addf("the global allocator runs in %d overlays %v, want exactly 1", len(hosts), names)
	} else {
		g := hosts[0]
		for _, s := range summaries {
			host, port, err := net.SplitHostPort(s.globalAddr)
			if err != nil {
				continue // reported by checkOverlay
			}
			short := globalName + "." + g.globalNamespace
			okHost := slices.Contains([]string{short, short + ".svc", short + ".svc.cluster.local", short + ".svc.clusterset.local"}, host)
			if !okHost || port != strconv.Itoa(g.globalPort) {
				p.addf("region %s: -global-addr %q does not name Service %s in %s (port %d)", s.region, s.globalAddr, globalName, g.globalNamespace, g.globalPort)
			}
		}
	}

	for _, s := range summaries {
		if s.config == "" {
			continue // reported by checkOverlay
		}
		if s.config != baseConfig {
			p.addf("region %s: bootstrap config differs from base/sluice.yaml; there is one global config%s", s.region, configDiff(baseConfig, s.config))
		}
		cfg, err := config.Parse([]byte(s.config))
		if err != nil {
			continue
		}
		if got := slices.Sorted(maps.Keys(cfg.Regions)); !slices.Equal(got, regions) {
			p.addf("region %s: config regions %v, but the overlays are %v; every configured region needs an overlay and back", s.region, got, regions)
		}
	}
	for i, s := range summaries {
		first := summaries[0]
		if i == 0 {
			continue
		}
		if s.etcdPrefix != first.etcdPrefix || !slices.Equal(s.etcdEndpoints, first.etcdEndpoints) {
			p.addf("regions %s and %s use different etcd (%v%s vs %v%s); config and elections live in one etcd",
				first.region, s.region, first.etcdEndpoints, first.etcdPrefix, s.etcdEndpoints, s.etcdPrefix)
		}
	}
	return p
}

func configDiff(base, other string) string {
	a, errA := config.Parse([]byte(base))
	b, errB := config.Parse([]byte(other))
	if errA != nil || errB != nil {
		return ""
	}
	if d := config.Diff(a, b); d != "" {
		return ":\n" + d
	}
	return " (comments or layout only)"
}

// overlayRegions lists the overlay directories; each is named after its
// region.
func overlayRegions(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var regions []string
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "base" {
			continue
		}
		if _, err := os.Stat(filepath.Join(e.Name(), "kustomization.yaml")); err == nil {
			regions = append(regions, e.Name())
		}
	}
	if len(regions) == 0 {
		t.Fatal("no overlay directories with a kustomization.yaml")
	}
	return regions
}

func readBaseConfig(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("base", "sluice.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Parse(data); err != nil {
		t.Fatalf("base/sluice.yaml: %v", err)
	}
	return string(data)
}

// ---- tests ----

// generated finds the ConfigMap a configMapGenerator named name made
// (kustomize appends a content hash).
func generated(t *testing.T, r *rendered, name string) *configMapObj {
	t.Helper()
	for _, cm := range r.configMaps {
		if strings.HasPrefix(cm.Metadata.Name, name+"-") {
			return cm
		}
	}
	t.Fatalf("no ConfigMap generated as %s", name)
	return nil
}

func envNamed(t *testing.T, c *container, name string) *envVar {
	t.Helper()
	i := slices.IndexFunc(c.Env, func(e envVar) bool { return e.Name == name })
	if i < 0 {
		t.Fatalf("container %s has no env %s", c.Name, name)
	}
	return &c.Env[i]
}

// setArg replaces the value of the argument starting with prefix.
func setArg(t *testing.T, c *container, prefix, value string) {
	t.Helper()
	i := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, prefix) })
	if i < 0 {
		t.Fatalf("container %s has no argument %s", c.Name, prefix)
	}
	c.Args[i] = prefix + value
}

func TestOverlays(t *testing.T) {
	baseConfig := readBaseConfig(t)
	var summaries []overlaySummary
	for _, region := range overlayRegions(t) {
		out := kustomize(t, region)
		r, err := decode(out)
		if err != nil {
			t.Fatalf("%s: %v", region, err)
		}
		s, p := checkOverlay(r, region)
		t.Run(region, func(t *testing.T) {
			for _, msg := range p {
				t.Error(msg)
			}
		})
		summaries = append(summaries, s)
	}
	t.Run("fleet", func(t *testing.T) {
		for _, msg := range checkFleet(summaries, baseConfig) {
			t.Error(msg)
		}
	})
}

// TestTLSComponent renders us-east with the TLS component and https etcd
// endpoints, as the README tells production to do.
func TestTLSComponent(t *testing.T) {
	r := renderWith(t, "us-east", []string{"tls"},
		"etcd-endpoints=https://etcd-0.etcd.example:2379,https://etcd-1.etcd.example:2379")
	_, p := checkOverlay(r, "us-east")
	for _, msg := range p {
		t.Error(msg)
	}
	for _, name := range []string{regionalName, globalName} {
		d := r.deployment(name)
		if d == nil {
			t.Fatalf("no Deployment %s", name)
		}
		c := d.Spec.Template.Spec.Containers[0]
		var fp problems
		flags := podFlags(r, c, &fp)
		for _, msg := range fp {
			t.Error(msg)
		}
		// The regional certificate is also its client certificate towards
		// the global tier (-tls-ca verifies the global tier's); the global
		// allocator has its own.
		want := map[string]string{
			"tls-cert": "sluice-tls", "tls-key": "sluice-tls", "tls-client-ca": "sluice-tls", "tls-ca": "sluice-tls",
			"etcd-cert": "sluice-etcd-tls", "etcd-key": "sluice-etcd-tls", "etcd-ca": "sluice-etcd-tls",
		}
		if name == globalName {
			want = map[string]string{
				"tls-cert": "sluice-global-tls", "tls-key": "sluice-global-tls", "tls-client-ca": "sluice-global-tls",
				"etcd-cert": "sluice-etcd-tls", "etcd-key": "sluice-etcd-tls", "etcd-ca": "sluice-etcd-tls",
			}
		}
		for f, secret := range want {
			v, _, ok := mountedFile(d.Spec.Template.Spec, c, flags[f])
			if !ok || v.Secret == nil || v.Secret.SecretName != secret {
				t.Errorf("Deployment %s: -%s %q is not a file of Secret %s", name, f, flags[f], secret)
			}
		}
		if rp := c.ReadinessProbe; rp == nil || rp.GRPC != nil || rp.HTTPGet == nil {
			t.Errorf("Deployment %s: readiness %+v, want only an HTTP probe under TLS", name, rp)
		}
	}
}

// TestChecksCatchMistakes breaks a correct render in the ways an edit
// could, and expects the checks to say so.
func TestChecksCatchMistakes(t *testing.T) {
	baseConfig := readBaseConfig(t)
	out := kustomize(t, "us-east")
	fresh := func(t *testing.T) *rendered {
		t.Helper()
		r, err := decode(out)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	regional := func(r *rendered) *container { return &r.deployment(regionalName).Spec.Template.Spec.Containers[0] }

	if _, p := checkOverlay(fresh(t), "us-east"); len(p) != 0 {
		t.Fatalf("the unchanged render must pass before mutations mean anything: %v", p)
	}
	cases := []struct {
		name   string
		region string
		mutate func(t *testing.T, r *rendered)
		want   string
	}{
		{"wrong region value", "us-east", func(t *testing.T, r *rendered) { generated(t, r, "sluice-env").Data["region"] = "eu-west" }, `-region "eu-west", want "us-east"`},
		{"rendered for another region", "mars", func(*testing.T, *rendered) {}, `namespace "sluice-us-east", want "sluice-mars"`},
		{"missing redis address", "us-east", func(t *testing.T, r *rendered) { delete(generated(t, r, "sluice-env").Data, "redis-addr") }, `has no key "redis-addr"`},
		{"etcd endpoint without port", "us-east", func(t *testing.T, r *rendered) { generated(t, r, "sluice-env").Data["etcd-endpoints"] = "http://etcd" }, "want http(s)://host:port"},
		{"readiness on the metrics port", "us-east", func(t *testing.T, r *rendered) { regional(r).ReadinessProbe.GRPC.Port = regionalHTTP }, "readiness must be the gRPC health probe"},
		{"liveness on /healthz", "us-east", func(t *testing.T, r *rendered) { regional(r).LivenessProbe.HTTPGet.Path = "/healthz" }, "liveness must not follow"},
		{"listen on another port", "us-east", func(t *testing.T, r *rendered) { setArg(t, regional(r), "-listen=", ":7000") }, "-listen \":7000\""},
		{"misspelt flag variable", "us-east", func(t *testing.T, r *rendered) {
			envNamed(t, regional(r), "SLUICE_REDIS_ADDR").Name = "SLUICE_REDIS_ADRR"
		}, "no flag -redis-adrr"},
		{"password in plain text", "us-east", func(t *testing.T, r *rendered) {
			c := regional(r)
			c.Env = append(c.Env, envVar{Name: "SLUICE_REDIS_PASSWORD", Value: "hunter2"})
		}, "must come from a Secret"},
		{"untagged image", "us-east", func(t *testing.T, r *rendered) { regional(r).Image = image }, "pinned to a tag or digest"},
		{"writable root filesystem", "us-east", func(t *testing.T, r *rendered) { *regional(r).SecurityContext.ReadOnlyRootFilesystem = false }, "readOnlyRootFilesystem"},
		{"no PDB", "us-east", func(t *testing.T, r *rendered) {
			r.pdbs = slices.DeleteFunc(r.pdbs, func(p *pdbObj) bool { return p.Metadata.Name == regionalName })
		}, "0 PodDisruptionBudgets"},
		{"HPA targets another deployment", "us-east", func(t *testing.T, r *rendered) { r.hpas[0].Spec.ScaleTargetRef.Name = "other" }, "no HorizontalPodAutoscaler targets"},
		{"replicas above the HPA maximum", "us-east", func(t *testing.T, r *rendered) { *r.deployment(regionalName).Spec.Replicas = 100 }, "outside the autoscaler's"},
		{"global with 2 replicas", "us-east", func(t *testing.T, r *rendered) { *r.deployment(globalName).Spec.Replicas = 2 }, "want 3"},
		{"global advertises the Service", "us-east", func(t *testing.T, r *rendered) {
			setArg(t, &r.deployment(globalName).Spec.Template.Spec.Containers[0], "-advertise=", "sluice-global:7500")
		}, "-advertise"},
		{"object without namespace", "us-east", func(t *testing.T, r *rendered) {
			r.objects[slices.IndexFunc(r.objects, func(o *header) bool { return o.Kind == "ConfigMap" })].Metadata.Namespace = ""
		}, `namespace "", want "sluice-us-east"`},
		{"invalid bootstrap config", "us-east", func(t *testing.T, r *rendered) {
			cm := generated(t, r, "sluice-config")
			cm.Data["sluice.yaml"] = strings.Replace(cm.Data["sluice.yaml"], "rate: 10/s", "rate: -10/s", 1)
		}, "tiers.free.read.rate"},
		{"config without the region", "us-east", func(t *testing.T, r *rendered) {
			cm := generated(t, r, "sluice-config")
			cm.Data["sluice.yaml"] = strings.Replace(cm.Data["sluice.yaml"], "us-east:  {weight: 2}", "us-central: {weight: 2}", 1)
		}, `do not include "us-east"`},
		{"service selects nothing", "us-east", func(t *testing.T, r *rendered) { r.service(regionalName).Spec.Selector = map[string]string{"app": "x"} }, "does not match the pods"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := fresh(t)
			tc.mutate(t, r)
			_, p := checkOverlay(r, tc.region)
			if !slices.ContainsFunc(p, func(m string) bool { return strings.Contains(m, tc.want) }) {
				t.Errorf("want a problem containing %q, got %q", tc.want, p)
			}
		})
	}

	t.Run("fleet", func(t *testing.T) {
		good, p := checkOverlay(fresh(t), "us-east")
		if len(p) != 0 {
			t.Fatal(p)
		}
		// A minimal consistent fleet: the config names only us-east.
		oneRegion := strings.Replace(strings.Replace(baseConfig, "  eu-west:  {weight: 1}\n", "", 1), "  ap-south: {weight: 1}\n", "", 1)
		single := good
		single.config = oneRegion
		if p := checkFleet([]overlaySummary{single}, oneRegion); len(p) != 0 {
			t.Fatalf("a consistent one-region fleet must pass: %v", p)
		}
		twin := func(region string, edit func(*overlaySummary)) overlaySummary {
			s := good
			s.region, s.redisAddr = region, "redis."+region+":6379"
			s.globalNamespace, s.globalPort = "", 0
			edit(&s)
			return s
		}
		fleetCases := []struct {
			name  string
			fleet []overlaySummary
			want  string
		}{
			{"config region without overlay", []overlaySummary{good}, "every configured region needs an overlay"},
			{"config drift", []overlaySummary{good, twin("eu-west", func(s *overlaySummary) {
				s.config = strings.Replace(s.config, "rate: 2000/s", "rate: 3000/s", 1)
			})}, "differs from base/sluice.yaml"},
			{"shared redis", []overlaySummary{good, twin("eu-west", func(s *overlaySummary) { s.redisAddr = good.redisAddr })}, "share Redis"},
			{"two allocators", []overlaySummary{good, twin("eu-west", func(s *overlaySummary) { s.globalNamespace, s.globalPort = "sluice-eu-west", 7500 })}, "runs in 2 overlays"},
			{"no allocator", []overlaySummary{twin("us-east", func(*overlaySummary) {})}, "runs in 0 overlays"},
			{"global address elsewhere", []overlaySummary{good, twin("eu-west", func(s *overlaySummary) { s.globalAddr = "sluice-global.sluice-eu-west.svc:7500" })}, "does not name Service"},
			{"different etcd", []overlaySummary{good, twin("eu-west", func(s *overlaySummary) { s.etcdPrefix = "/other" })}, "different etcd"},
		}
		for _, tc := range fleetCases {
			p := checkFleet(tc.fleet, baseConfig)
			if !slices.ContainsFunc(p, func(m string) bool { return strings.Contains(m, tc.want) }) {
				t.Errorf("%s: want a problem containing %q, got %q", tc.name, tc.want, p)
			}
		}
	})
}

// renderWith renders a copy of region's overlay with more components of
// base listed next to its own and sluice-env literals replaced (key=value),
// as the README tells an operator to edit the overlay.
func renderWith(t *testing.T, region string, components []string, literals ...string) *rendered {
	t.Helper()
	dir := t.TempDir()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	// kustomize refuses absolute paths, so point at the tree relatively.
	rel, err := filepath.Rel(dir, here)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.ToSlash(rel) + "/base"
	files, err := os.ReadDir(region)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(region, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if f.Name() == "kustomization.yaml" {
			text = strings.ReplaceAll(text, "../base", base)
			var more strings.Builder
			for _, c := range components {
				fmt.Fprintf(&more, "  - %s/%s\n", base, c)
			}
			// After the overlay's own components: a component patches
			// only what the ones before it added (base/tls patches
			// every shard's Deployment).
			own := "components:\n"
			for _, line := range strings.SplitAfter(text[strings.Index(text, own)+len(own):], "\n") {
				if !strings.HasPrefix(line, "  - ") {
					break
				}
				own += line
			}
			text = strings.Replace(text, own, own+more.String(), 1)
			for _, kv := range literals {
				key, _, _ := strings.Cut(kv, "=")
				i := strings.Index(text, "      - "+key+"=")
				if i < 0 {
					t.Fatalf("%s/kustomization.yaml has no %s literal", region, key)
				}
				j := i + strings.IndexByte(text[i:], '\n')
				text = text[:i] + "      - " + kv + text[j:]
			}
		}
		if err := os.WriteFile(filepath.Join(dir, f.Name()), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := decode(kustomize(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestShardComponent renders the overlay that runs the global tier with
// base/global-shard-1, as the README's sharded global tier does (regions
// dial sluice-global-shard-{shard}), plain and with the TLS component:
// shard 1 is a global Deployment like shard 0's but for -shard=1, every
// shard's Service name the address template gives selects exactly that
// shard's pods, and under TLS shard 1 serves and dials etcd with the same
// certificates as shard 0.
func TestShardComponent(t *testing.T) {
	const shardName = "sluice-global-shard-1"
	template := "global-addr=sluice-global-shard-{shard}.sluice-us-east.svc:7500"
	for _, tc := range []struct {
		name       string
		components []string
		env        []string
	}{
		{"plain", []string{"global-shard-1"}, []string{template}},
		{"tls", []string{"global-shard-1", "tls"}, []string{template,
			"etcd-endpoints=https://etcd-0.etcd.example:2379,https://etcd-1.etcd.example:2379"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := renderWith(t, "us-east", tc.components, tc.env...)
			_, p := checkOverlay(r, "us-east")
			for _, msg := range p {
				t.Error(msg)
			}
			gd, sd := r.deployment(globalName), r.deployment(shardName)
			if gd == nil || sd == nil {
				t.Fatalf("Deployments %s and %s must both render (got %v, %v)", globalName, shardName, gd != nil, sd != nil)
			}
			var sp problems
			sflags, scfg := checkPod(r, sd, podWant{
				component: "global-shard-1", binary: "global", grpcPort: globalGRPC, metricsPort: globalHTTP, knownFlags: globalFlags(),
			}, &sp)
			for _, msg := range sp {
				t.Error(msg)
			}
			var gp problems
			gflags, gcfg := checkPod(r, gd, podWant{
				component: "global", binary: "global", grpcPort: globalGRPC, metricsPort: globalHTTP, knownFlags: globalFlags(),
			}, &gp)
			if sflags["shard"] != "1" {
				t.Errorf("Deployment %s: -shard %q, want 1", shardName, sflags["shard"])
			}
			if v, ok := gflags["shard"]; ok && v != "0" {
				t.Errorf("Deployment %s: -shard %q, want 0 (or unset)", globalName, v)
			}
			// Apart from the shard, shard 1 runs as shard 0 does: the same
			// config, etcd, prefix and (under TLS) certificates.
			for f, v := range gflags {
				if f != "shard" && sflags[f] != v {
					t.Errorf("Deployment %s: -%s %q, but %s runs with %q", shardName, f, sflags[f], globalName, v)
				}
			}
			for f := range sflags {
				if _, ok := gflags[f]; !ok && f != "shard" {
					t.Errorf("Deployment %s: -%s is set only on shard 1", shardName, f)
				}
			}
			if scfg != gcfg {
				t.Errorf("Deployment %s runs a different bootstrap config from %s", shardName, globalName)
			}
			if sd.Spec.Replicas == nil || *sd.Spec.Replicas != globalReplica {
				t.Errorf("Deployment %s: replicas %v, want %d (a leader and two standbys)", shardName, deref(sd.Spec.Replicas), globalReplica)
			}

			// The regions' address template names one Service per shard,
			// each selecting that shard's pods and no other shard's.
			rd := r.deployment(regionalName)
			var rp problems
			addr := podFlags(r, rd.Spec.Template.Spec.Containers[0], &rp)["global-addr"]
			if !strings.Contains(addr, "{shard}") {
				t.Fatalf("the regional service's -global-addr %q has no {shard}: the merge did not reach it", addr)
			}
			pods := map[string]map[string]string{
				"0": gd.Spec.Template.Metadata.Labels,
				"1": sd.Spec.Template.Metadata.Labels,
			}
			for shard := range pods {
				host, _, err := net.SplitHostPort(strings.ReplaceAll(addr, "{shard}", shard))
				if err != nil {
					t.Fatalf("-global-addr %q: %v", addr, err)
				}
				name, ns, _ := strings.Cut(host, ".")
				if want := "sluice-us-east"; !strings.HasPrefix(ns, want+".") {
					t.Errorf("shard %s's address %s is not in namespace %s", shard, host, want)
				}
				svc := r.service(name)
				if svc == nil {
					t.Errorf("shard %s: -global-addr names Service %s, which is not rendered", shard, name)
					continue
				}
				for other, labels := range pods {
					if got := (labelSelector{MatchLabels: svc.Spec.Selector}).selects(labels); got != (other == shard) {
						t.Errorf("Service %s (shard %s) selects shard %s's pods: %v", name, shard, other, got)
					}
				}
			}
		})
	}
}
