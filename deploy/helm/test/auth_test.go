package helmtest

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// renderAll renders vs and decodes the result, without requiring the test
// pod, which tls.clientAuth leaves out.
func renderAll(t *testing.T, vs valueSet) *manifests {
	t.Helper()
	out, err := template(t, vs)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, out)
}

// secretVolume returns the Secret volume named name of spec and where
// container c mounts it, failing t when either is missing.
func secretVolume(t *testing.T, spec corev1.PodSpec, c corev1.Container, name string) (*corev1.SecretVolumeSource, corev1.VolumeMount) {
	t.Helper()
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
	if i < 0 || spec.Volumes[i].Secret == nil {
		t.Fatalf("got no Secret volume %q in %+v", name, spec.Volumes)
	}
	j := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == name })
	if j < 0 {
		t.Fatalf("container %s does not mount volume %q", c.Name, name)
	}
	return spec.Volumes[i].Secret, c.VolumeMounts[j]
}

// itemsOf returns a Secret volume's items as key=path.
func itemsOf(s *corev1.SecretVolumeSource) []string {
	var out []string
	for _, it := range s.Items {
		out = append(out, it.Key+"="+it.Path)
	}
	return out
}

// The tokens file comes from an existing Secret, mounted read-only as a
// directory (so the kubelet updates the file and the service rereads it)
// and passed with --tokens-file; without tokens.existingSecret nothing of
// it is rendered.
func TestTokensFromSecret(t *testing.T) {
	t.Parallel()
	m := render(t, valueSet{name: "tokens", extra: "tokens: {existingSecret: rl-tokens, existingSecretKey: tokens}\n"})
	spec := m.Deployment.Spec.Template.Spec
	c := m.container(t)
	if want := "--tokens-file=/etc/ratelimiter/tokens/tokens.yaml"; !slices.Contains(c.Args, want) {
		t.Errorf("args: got %q, want %s", c.Args, want)
	}
	vol, mount := secretVolume(t, spec, c, "tokens")
	if vol.SecretName != "rl-tokens" || !slices.Equal(itemsOf(vol), []string{"tokens=tokens.yaml"}) {
		t.Errorf("tokens volume: got Secret %s items %v, want rl-tokens items [tokens=tokens.yaml]", vol.SecretName, itemsOf(vol))
	}
	if vol.DefaultMode == nil || *vol.DefaultMode != 0o440 {
		t.Errorf("tokens volume: got mode %v, want 0440", vol.DefaultMode)
	}
	if !mount.ReadOnly || mount.SubPath != "" || mount.MountPath != "/etc/ratelimiter/tokens" {
		t.Errorf("tokens mount: got %+v, want /etc/ratelimiter/tokens read-only, without subPath", mount)
	}
	// The service takes the flag.
	cfg, _ := serviceConfig(t, m)
	if cfg.TokensFile != "/etc/ratelimiter/tokens/tokens.yaml" {
		t.Errorf("the service's tokens file: got %q, want /etc/ratelimiter/tokens/tokens.yaml", cfg.TokensFile)
	}

	d := render(t, valueSet{name: "defaults"})
	dc := d.container(t)
	if slices.ContainsFunc(dc.Args, func(a string) bool { return strings.HasPrefix(a, "--tokens-file") || strings.HasPrefix(a, "--tls-") }) {
		t.Errorf("defaults: got args %q, want no tokens file and no TLS", dc.Args)
	}
	for _, v := range d.Deployment.Spec.Template.Spec.Volumes {
		if v.Name == "tokens" || v.Name == "tls" {
			t.Errorf("defaults: got volume %s", v.Name)
		}
	}
}

// TLS comes from an existing kubernetes.io/tls Secret: its files are
// mounted read-only and passed as --tls-cert-file, --tls-key-file and,
// with clientAuth, --tls-client-ca-file. The probes, helm test and the
// scrape follow: HTTPS probes over TLS, TCP probes and no test pod when
// clients must present a certificate the kubelet cannot.
func TestTLSFromSecret(t *testing.T) {
	t.Parallel()
	monitoring := "metrics: {serviceMonitor: {enabled: true, tlsConfig: {serverName: rel-ratelimiter, ca: {secret: {name: web-tls, key: ca.crt}}}}}\n"
	for _, tc := range []struct {
		name, values string
		args, items  []string
		probe        string // HTTPS or TCP
		testPod      bool
	}{
		{
			name:   "server certificate",
			values: "tls: {existingSecret: web-tls}\n" + monitoring,
			args:   []string{"--tls-cert-file=/etc/ratelimiter/tls/tls.crt", "--tls-key-file=/etc/ratelimiter/tls/tls.key"},
			items:  []string{"tls.crt=tls.crt", "tls.key=tls.key"},
			probe:  "HTTPS", testPod: true,
		},
		{
			name:   "client certificates",
			values: "tls: {existingSecret: web-tls, clientAuth: true}\n" + monitoring,
			args: []string{"--tls-cert-file=/etc/ratelimiter/tls/tls.crt", "--tls-key-file=/etc/ratelimiter/tls/tls.key",
				"--tls-client-ca-file=/etc/ratelimiter/tls/ca.crt"},
			items: []string{"tls.crt=tls.crt", "tls.key=tls.key", "ca.crt=ca.crt"},
			probe: "TCP",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vs := valueSet{name: tc.name, extra: tc.values}
			lint := []string{"lint", "--strict", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}
			if out, err := runHelm(t, append(lint, vs.args(t)...)...); err != nil || !strings.Contains(out, "0 chart(s) failed") {
				t.Errorf("helm lint: %v\n%s", err, out)
			}
			m := renderAll(t, vs)
			spec := m.Deployment.Spec.Template.Spec
			c := m.container(t)
			var tlsArgs []string
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--tls-") {
					tlsArgs = append(tlsArgs, a)
				}
			}
			if !slices.Equal(tlsArgs, tc.args) {
				t.Errorf("TLS args: got %q, want %q", tlsArgs, tc.args)
			}
			vol, mount := secretVolume(t, spec, c, "tls")
			if vol.SecretName != "web-tls" || !slices.Equal(itemsOf(vol), tc.items) {
				t.Errorf("tls volume: got Secret %s items %v, want web-tls items %v", vol.SecretName, itemsOf(vol), tc.items)
			}
			if !mount.ReadOnly || mount.SubPath != "" || mount.MountPath != "/etc/ratelimiter/tls" {
				t.Errorf("tls mount: got %+v, want /etc/ratelimiter/tls read-only, without subPath", mount)
			}

			for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
				switch tc.probe {
				case "HTTPS":
					if p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Port != intstr.FromString("http") {
						t.Errorf("%s probe: got %+v, want an HTTPS GET on the http port", name, p.ProbeHandler)
					}
				case "TCP":
					if p.TCPSocket == nil || p.HTTPGet != nil || p.TCPSocket.Port != intstr.FromString("http") {
						t.Errorf("%s probe: got %+v, want a TCP check of the http port", name, p.ProbeHandler)
					}
				}
			}

			if got := m.Deployment.Spec.Template.Annotations["prometheus.io/scheme"]; got != "https" {
				t.Errorf("prometheus.io/scheme: got %q, want https", got)
			}
			if m.ServiceMonitor == nil {
				t.Fatal("no ServiceMonitor")
			}
			ep := m.ServiceMonitor.Spec.Endpoints[0]
			if ep.Scheme == nil || strings.ToLower(ep.Scheme.String()) != "https" || ep.TLSConfig == nil || ep.TLSConfig.ServerName == nil || *ep.TLSConfig.ServerName != "rel-ratelimiter" {
				t.Errorf("ServiceMonitor endpoint: got scheme %v tlsConfig %+v, want https with the values' tlsConfig", ep.Scheme, ep.TLSConfig)
			}

			if !tc.testPod {
				if m.TestPod != nil {
					t.Error("got a test pod, which cannot present a client certificate")
				}
				return
			}
			if m.TestPod == nil {
				t.Fatal("no test pod")
			}
			tc0 := m.TestPod.Spec.Containers[0]
			if want := []string{"probe", "https://rel-ratelimiter:8080/readyz"}; !slices.Equal(tc0.Args, want) {
				t.Errorf("test pod args: got %q, want %q", tc0.Args, want)
			}
			if e := env(tc0)["SSL_CERT_FILE"]; e.Value != "/etc/ratelimiter/tls/ca.crt" {
				t.Errorf("test pod SSL_CERT_FILE: got %q, want /etc/ratelimiter/tls/ca.crt", e.Value)
			}
			pvol, _ := secretVolume(t, m.TestPod.Spec, tc0, "tls")
			if pvol.SecretName != "web-tls" || !slices.Equal(itemsOf(pvol), []string{"ca.crt=ca.crt"}) {
				t.Errorf("test pod tls volume: got Secret %s items %v, want web-tls [ca.crt=ca.crt]", pvol.SecretName, itemsOf(pvol))
			}
		})
	}

	// Without TLS the probes and the scrape stay on plain HTTP.
	m := render(t, valueSet{name: "defaults", extra: "metrics: {serviceMonitor: {enabled: true}}\n"})
	c := m.container(t)
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTP {
			t.Errorf("defaults: %s probe: got %+v, want an HTTP GET", name, p.ProbeHandler)
		}
	}
	if ep := m.ServiceMonitor.Spec.Endpoints[0]; ep.Scheme == nil || strings.ToLower(ep.Scheme.String()) != "http" || ep.TLSConfig != nil {
		t.Errorf("defaults: ServiceMonitor endpoint: got scheme %v tlsConfig %+v, want http without tlsConfig", ep.Scheme, ep.TLSConfig)
	}
}

// Values the chart refuses, with a message that names them.
func TestTokensAndTLSRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, values, want string }{
		{"client certificates without a Secret", "tls: {clientAuth: true}\n", "tls.clientAuth is true but tls.existingSecret is empty"},
		{"unknown tls key", "tls: {existingSecret: web-tls, caSecret: x}\n", "caSecret"},
		{"unknown tokens key", "tokens: {secret: x}\n", "secret"},
		{"tokens Secret not a name", "tokens: {existingSecret: Not_A_Name}\n", "existingSecret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := mustFail(t, valueSet{name: tc.name, extra: tc.values}); !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want it to mention %q", got, tc.want)
			}
		})
	}
}

// The notes say where the tokens come from, or warn that decisions and
// refunds are open to every caller; and that the listeners serve TLS.
func TestNotesOnTokensAndTLS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, values  string
		want, notWant []string
	}{
		{name: "defaults", want: []string{"WARNING: no tokens file is configured"}, notWant: []string{"serve TLS"}},
		{name: "tokens and TLS", values: "tokens: {existingSecret: rl-tokens}\ntls: {existingSecret: web-tls}\n",
			want: []string{"Tokens with scopes come from Secret rl-tokens (key tokens.yaml)", "Both listeners serve TLS with the certificate of Secret web-tls",
				"These operations require a token with the admin scope from the tokens file"},
			notWant: []string{"WARNING: no tokens file", "client must present", "WARNING: no admin token"}},
		{name: "client certificates", values: "tls: {existingSecret: web-tls, clientAuth: true}\n",
			want: []string{"every client must present a certificate signed by its ca.crt"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			notes := renderNotes(t, valueSet{name: tc.name, extra: tc.values})
			flat := strings.Join(strings.Fields(notes), " ")
			for _, w := range tc.want {
				if !strings.Contains(flat, strings.Join(strings.Fields(w), " ")) {
					t.Errorf("notes lack %q:\n%s", w, notes)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(flat, w) {
					t.Errorf("notes hold %q:\n%s", w, notes)
				}
			}
		})
	}
}
