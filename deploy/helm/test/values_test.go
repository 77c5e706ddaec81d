package helmtest

import (
	"strings"
	"testing"
)

// TestSchemaRejectsBadValues checks that values.schema.json refuses values
// that cannot work, before anything renders, with an error that names the
// key and the problem.
func TestSchemaRejectsBadValues(t *testing.T) {
	t.Parallel()
	const schemaError = "values don't meet the specifications of the schema"
	tests := []struct {
		name   string
		values string
		want   []string // in helm's error
	}{
		{"unknown top-level key", "replicas: 1\n", []string{"at ''", "additional properties 'replicas' not allowed"}},
		{"unknown nested key", "config:\n  tenants:\n    ipv6Prefix: 48\n", []string{"at '/config/tenants'", "additional properties 'ipv6Prefix' not allowed"}},
		{"unknown key in a limiter", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, window: 1s}\n", []string{"at '/config/limiters/0'", "'window' not allowed"}},
		{"unknown key in a security context", "securityContext:\n  runAsRoot: true\n", []string{"at '/securityContext'", "'runAsRoot' not allowed"}},
		{"unknown key deep in affinity", "affinity:\n  nodeAffinity:\n    requiredDuringScheduling: {}\n", []string{"at '/affinity/nodeAffinity'", "'requiredDuringScheduling' not allowed"}},
		{"wrong type", "replicaCount: one\n", []string{"at '/replicaCount'", "got string, want integer"}},
		{"wrong type nested", "service:\n  port: \"8080\"\n", []string{"at '/service/port'", "got string, want integer"}},
		{"negative replicas", "replicaCount: -1\n", []string{"at '/replicaCount'", "minimum: got -1, want 0"}},
		{"unknown backend", "backend:\n  type: etcd\n", []string{"at '/backend/type'", "value must be one of 'memory', 'redis'"}},
		{"redis without an address", "backend:\n  type: redis\n", []string{"at '/backend/redis/addrs'", "minItems: got 0, want 1"}},
		{"redis address without a port", "backend: {type: redis, redis: {addrs: [redis]}}\n", []string{"at '/backend/redis/addrs/0'", "does not match pattern"}},
		{"redis address with a URL", "backend: {type: redis, redis: {addrs: ['redis://redis:6379']}}\n", []string{"at '/backend/redis/addrs/0'", "does not match pattern"}},
		{"redis port out of range", "backend: {type: redis, redis: {addrs: ['redis:65536']}}\n", []string{"at '/backend/redis/addrs/0'", "does not match pattern"}},
		{"redis IPv6 address without brackets", "backend: {type: redis, redis: {addrs: ['fd00::1:6379']}}\n", []string{"at '/backend/redis/addrs/0'", "does not match pattern"}},
		{"redis address twice", "backend: {type: redis, redis: {addrs: ['a:6379', 'a:6379']}}\n", []string{"at '/backend/redis/addrs'", "items at 0 and 1 are equal"}},
		{"redis address as a string", "backend: {type: redis, redis: {addrs: 'a:6379'}}\n", []string{"at '/backend/redis/addrs'", "got string, want array"}},
		{"bad redis failure mode", "backend: {redis: {failureMode: open}}\n", []string{"at '/backend/redis/failureMode'", "value must be one of 'fail-closed', 'fail-open'"}},
		{"unknown key under backend.redis", "backend: {redis: {db: 1}}\n", []string{"at '/backend/redis'", "additional properties 'db' not allowed"}},
		{"unknown key under backend.redis.tls", "backend: {redis: {tls: {insecureSkipVerify: true}}}\n", []string{"at '/backend/redis/tls'", "additional properties 'insecureSkipVerify' not allowed"}},
		{"redis TLS as a string", "backend: {redis: {tls: {enabled: 'yes'}}}\n", []string{"at '/backend/redis/tls/enabled'", "got string, want boolean"}},
		{"redis key prefix with braces", "backend: {redis: {keyPrefix: 'a{b}:'}}\n", []string{"at '/backend/redis/keyPrefix'", "does not match pattern"}},
		{"redis key prefix with a space", "backend: {redis: {keyPrefix: 'a b'}}\n", []string{"at '/backend/redis/keyPrefix'", "does not match pattern"}},
		{"empty redis key prefix", "backend: {redis: {keyPrefix: ''}}\n", []string{"at '/backend/redis/keyPrefix'", "minLength: got 0, want 1"}},
		{"redis key prefix too long", "backend: {redis: {keyPrefix: '" + strings.Repeat("k", 65) + "'}}\n", []string{"at '/backend/redis/keyPrefix'", "maxLength: got 65, want 64"}},
		{"zero redis timeout", "backend: {redis: {timeout: 0s}}\n", []string{"at '/backend/redis/timeout'"}},
		{"redis timeout without a unit", "backend: {redis: {timeout: 50}}\n", []string{"at '/backend/redis/timeout'", "got number, want string"}},
		{"redis dial timeout not a duration", "backend: {redis: {dialTimeout: 1 second}}\n", []string{"at '/backend/redis/dialTimeout'", "does not match pattern"}},
		{"redis conns per node not a power of two", "backend: {redis: {connsPerNode: 3}}\n", []string{"at '/backend/redis/connsPerNode'", "value must be one of"}},
		{"negative redis conns per node", "backend: {redis: {connsPerNode: -1}}\n", []string{"at '/backend/redis/connsPerNode'", "value must be one of"}},
		{"redis deny cache too large", "backend: {redis: {denyCache: 1000001}}\n", []string{"at '/backend/redis/denyCache'", "maximum"}},
		{"redis conns per node above 256", "backend: {redis: {connsPerNode: 512}}\n", []string{"at '/backend/redis/connsPerNode'", "value must be one of"}},
		{"redis conns per node as a string", "backend: {redis: {connsPerNode: '4'}}\n", []string{"at '/backend/redis/connsPerNode'", "got string, want integer"}},
		{"fractional redis conns per node", "backend: {redis: {connsPerNode: 2.5}}\n", []string{"at '/backend/redis/connsPerNode'", "got number, want integer"}},
		{"redis password with surrounding spaces", "backend: {redis: {password: ' pw '}}\n", []string{"at '/backend/redis/password'", "does not match pattern"}},
		{"redis user with a space", "backend: {redis: {username: 'a b'}}\n", []string{"at '/backend/redis/username'", "does not match pattern"}},
		{"bad redis password Secret name", "backend: {redis: {existingSecret: Redis_Auth}}\n", []string{"at '/backend/redis/existingSecret'"}},
		{"bad eviction policy", "podDisruptionBudget: {unhealthyPodEvictionPolicy: Never}\n", []string{"at '/podDisruptionBudget/unhealthyPodEvictionPolicy'", "value must be one of"}},
		{"unknown key under egress.redis", "networkPolicy: {egress: {redis: {ports: [6379]}}}\n", []string{"at '/networkPolicy/egress/redis'", "additional properties 'ports' not allowed"}},
		{"bad service type", "service:\n  type: ExternalName\n", []string{"at '/service/type'", "value must be one of"}},
		{"bad traces exporter", "otel:\n  tracesExporter: jaeger\n", []string{"at '/otel/tracesExporter'", "value must be one of"}},
		{"bad log level", "log:\n  level: verbose\n", []string{"at '/log/level'", "value must be one of"}},
		{"port out of range", "containerPort: 70000\n", []string{"at '/containerPort'", "maximum"}},
		{"gRPC port out of range", "grpc: {containerPort: 0}\n", []string{"at '/grpc/containerPort'", "minimum"}},
		{"gRPC switch as a string", "grpc: {enabled: 'no'}\n", []string{"at '/grpc/enabled'", "got string, want boolean"}},
		{"unknown key under grpc", "grpc: {port: 8081}\n", []string{"at '/grpc'", "additional properties 'port' not allowed"}},
		{"Service gRPC port as a string", "service: {grpcPort: '8081'}\n", []string{"at '/service/grpcPort'", "got string, want integer"}},
		{"Envoy rules in a file not ending in .yaml", "envoy: {config: {web.yml: 'domain: web'}}\n", []string{"invalid propertyName 'web.yml'", "does not match pattern"}},
		{"Envoy rules in a hidden file", "envoy: {config: {..data.yaml: 'domain: web'}}\n", []string{"invalid propertyName '..data.yaml'", "does not match pattern"}},
		{"Envoy rules as a map, not text", "envoy: {config: {web.yaml: {domain: web}}}\n", []string{"at '/envoy/config/web.yaml'", "got object, want string"}},
		{"Envoy rules as a list", "envoy: {config: ['domain: web']}\n", []string{"at '/envoy/config'", "got array, want object"}},
		{"empty Envoy rules file", "envoy: {config: {web.yaml: ''}}\n", []string{"at '/envoy/config/web.yaml'", "minLength"}},
		{"bad Envoy ConfigMap name", "envoy: {existingConfigMap: Mesh_Rules}\n", []string{"at '/envoy/existingConfigMap'"}},
		{"Envoy headers as a string", "envoy: {headers: 'true'}\n", []string{"at '/envoy/headers'", "got string, want boolean"}},
		{"unknown key under envoy", "envoy: {configMap: rules}\n", []string{"at '/envoy'", "additional properties 'configMap' not allowed"}},
		{"limiter without a period", "config:\n  limiters:\n    - {name: a, limit: 1}\n", []string{"at '/config/limiters/0'", "missing property 'period'"}},
		{"bad limiter name", "config:\n  limiters:\n    - {name: -a, limit: 1, period: 1s}\n", []string{"at '/config/limiters/0/name'", "does not match pattern"}},
		{"limit above the maximum", "config:\n  limiters:\n    - {name: a, limit: 1000000001, period: 1s}\n", []string{"at '/config/limiters/0/limit'", "maximum"}},
		{"bad limiter group", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, group: 'team a'}\n", []string{"at '/config/limiters/0/group'", "does not match pattern"}},
		{"empty limiter group", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, group: ''}\n", []string{"at '/config/limiters/0/group'", "does not match pattern"}},
		{"limiter group too long", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, group: " + strings.Repeat("g", 129) + "}\n", []string{"at '/config/limiters/0/group'", "does not match pattern"}},
		{"limiter group as a number", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, group: 7}\n", []string{"at '/config/limiters/0/group'", "got number, want string"}},
		{"keyed as a string", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, keyed: 'yes'}\n", []string{"at '/config/limiters/0/keyed'", "got string, want boolean"}},
		{"max_keys without keyed", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, max_keys: 10}\n", []string{"at '/config/limiters/0'", "missing property 'keyed'"}},
		{"max_keys of a limiter not keyed", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, keyed: false, max_keys: 10}\n", []string{"at '/config/limiters/0/keyed'", "value must be true"}},
		{"max_keys of zero", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 0}\n", []string{"at '/config/limiters/0/max_keys'", "minimum: got 0, want 1"}},
		{"max_keys above 10^7", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 10000001}\n", []string{"at '/config/limiters/0/max_keys'", "maximum"}},
		{"fractional max_keys", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 1.5}\n", []string{"at '/config/limiters/0/max_keys'", "got number, want integer"}},
		{"max_keys as a string", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s, keyed: true, max_keys: '10'}\n", []string{"at '/config/limiters/0/max_keys'", "got string, want integer"}},
		{"period not a duration", "config:\n  tenants:\n    period: 1 minute\n", []string{"at '/config/tenants/period'", "does not match pattern"}},
		{"burst with sliding_log", "config:\n  tenants:\n    algorithm: sliding_log\n    burst: 5\n", []string{"at '/config/tenants/burst'", "value must be 0"}},
		{"per-IP memory bound of zero", "config:\n  tenants:\n    max_bytes: 0\n", []string{"at '/config/tenants/max_bytes'", "minimum: got 0, want 1"}},
		{"per-IP memory bound above 1 PiB", "config:\n  tenants:\n    max_bytes: 1125899906842625\n", []string{"at '/config/tenants/max_bytes'", "maximum"}},
		{"per-IP memory bound with a unit", "config:\n  tenants:\n    max_bytes: 256MiB\n", []string{"at '/config/tenants/max_bytes'", "got string, want integer"}},
		{"fractional per-IP memory bound", "config:\n  tenants:\n    max_bytes: 1.5\n", []string{"at '/config/tenants/max_bytes'", "got number, want integer"}},
		{"IPv6 prefix too long", "config:\n  tenants:\n    ipv6_prefix: 128\n", []string{"at '/config/tenants/ipv6_prefix'", "maximum: got 128, want 64"}},
		{"admin token with a space", "adminToken:\n  value: two words\n", []string{"at '/adminToken/value'", "does not match pattern"}},
		{"no limiters allowed", "server:\n  maxLimiters: 0\n", []string{"at '/server/maxLimiters'", "minimum: got 0, want 1"}},
		{"max limiters above 10^8", "server:\n  maxLimiters: 100000001\n", []string{"at '/server/maxLimiters'", "maximum"}},
		{"max limiters as a string", "server:\n  maxLimiters: '1000'\n", []string{"at '/server/maxLimiters'", "got string, want integer"}},
		{"no limiter labels in the metrics", "metrics:\n  maxLimiters: 0\n", []string{"at '/metrics/maxLimiters'", "minimum: got 0, want 1"}},
		{"metrics max limiters above 100000", "metrics:\n  maxLimiters: 100001\n", []string{"at '/metrics/maxLimiters'", "maximum: got 100,001, want 100,000"}},
		{"unknown key under serviceMonitor", "metrics: {serviceMonitor: {intervall: 30s}}\n", []string{"at '/metrics/serviceMonitor'", "additional properties 'intervall' not allowed"}},
		{"scrape interval not a duration", "metrics: {serviceMonitor: {interval: 30 seconds}}\n", []string{"at '/metrics/serviceMonitor/interval'", "'anyOf' failed"}},
		{"scrape interval of zero", "metrics: {serviceMonitor: {interval: 0s}}\n", []string{"at '/metrics/serviceMonitor/interval'", "'anyOf' failed"}},
		{"scrape interval a Go duration only", "metrics: {serviceMonitor: {interval: 1.5s}}\n", []string{"at '/metrics/serviceMonitor/interval'", "'anyOf' failed"}},
		{"unknown relabel action", "metrics: {serviceMonitor: {relabelings: [{action: delete}]}}\n", []string{"at '/metrics/serviceMonitor/relabelings/0/action'", "value must be one of"}},
		{"relabeling with a misspelt key", "metrics: {serviceMonitor: {metricRelabelings: [{source_labels: [a]}]}}\n", []string{"at '/metrics/serviceMonitor/metricRelabelings/0'", "'source_labels' not allowed"}},
		{"denial threshold of 1", "metrics: {prometheusRule: {highDenialRatio: {threshold: 1}}}\n", []string{"at '/metrics/prometheusRule/highDenialRatio/threshold'", "exclusiveMaximum"}},
		{"negative degraded threshold", "metrics: {prometheusRule: {degradedDecisions: {threshold: -0.1}}}\n", []string{"at '/metrics/prometheusRule/degradedDecisions/threshold'", "minimum"}},
		{"threshold in percent", "metrics: {prometheusRule: {highDenialRatio: {threshold: 50%}}}\n", []string{"at '/metrics/prometheusRule/highDenialRatio/threshold'", "got string, want number"}},
		{"alert window of zero", "metrics: {prometheusRule: {highDenialRatio: {window: 0m}}}\n", []string{"at '/metrics/prometheusRule/highDenialRatio/window'", "'not' failed"}},
		{"alert pending time not a duration", "metrics: {prometheusRule: {backendDown: {for: 1 minute}}}\n", []string{"at '/metrics/prometheusRule/backendDown/for'", "does not match pattern"}},
		{"empty severity", "metrics: {prometheusRule: {backendDown: {severity: ''}}}\n", []string{"at '/metrics/prometheusRule/backendDown/severity'", "minLength"}},
		{"severity among the alert labels", "metrics: {prometheusRule: {alertLabels: {severity: page}}}\n", []string{"invalid propertyName 'severity'"}},
		{"alert label not a Prometheus name", "metrics: {prometheusRule: {alertLabels: {team-name: a}}}\n", []string{"invalid propertyName 'team-name'", "does not match pattern"}},
		{"alert selector with braces", "metrics: {prometheusRule: {selector: '{job=\"a\"}'}}\n", []string{"at '/metrics/prometheusRule/selector'", "does not match pattern"}},
		{"unknown alert", "metrics: {prometheusRule: {podsNotReady: {enabled: true}}}\n", []string{"at '/metrics/prometheusRule'", "additional properties 'podsNotReady' not allowed"}},
		{"dashboard label value as a number", "metrics: {grafanaDashboard: {labelValue: 1}}\n", []string{"at '/metrics/grafanaDashboard/labelValue'", "got number, want string"}},
		{"dashboard label key with a space", "metrics: {grafanaDashboard: {label: grafana dashboard}}\n", []string{"at '/metrics/grafanaDashboard/label'", "does not match pattern"}},
		{"bad dashboard namespace", "metrics: {grafanaDashboard: {namespace: Monitoring}}\n", []string{"at '/metrics/grafanaDashboard/namespace'", "does not match pattern"}},
		{"unknown resource", "resources:\n  requests:\n    gpu: 1\n", []string{"at '/resources/requests'", "additional properties 'gpu' not allowed"}},
		{"capability in lower case", "securityContext:\n  capabilities:\n    drop: [all]\n", []string{"at '/securityContext/capabilities/drop/0'", "does not match pattern"}},
		{"unknown seccomp profile type", "podSecurityContext:\n  seccompProfile:\n    type: Default\n", []string{"at '/podSecurityContext/seccompProfile/type'", "value must be one of"}},
		{"user ID as a string", "podSecurityContext:\n  runAsUser: '65532'\n", []string{"at '/podSecurityContext/runAsUser'", "got string, want integer"}},
		{"GC floor below Go's own", "server:\n  gcMinHeapBytes: 1048576\n", []string{"at '/server/gcMinHeapBytes'"}},
		{"header limit Go cannot hold", "server:\n  maxHeaderBytes: 4096\n", []string{"at '/server/maxHeaderBytes'", "minimum: got 4,096, want 4,097"}},
		{"zero timeout", "server:\n  readTimeout: 0s\n", []string{"at '/server/readTimeout'"}},
		{"negative shutdown delay", "shutdown:\n  delaySeconds: -5\n", []string{"at '/shutdown/delaySeconds'", "minimum"}},
		{"sampler ratio above 1", "otel:\n  samplerArg: 1.5\n", []string{"at '/otel/samplerArg'", "maximum"}},
		{"endpoint not a URL", "otel:\n  endpoint: collector:4317\n", []string{"at '/otel/endpoint'", "does not match pattern"}},
		{"bad quantity", "resources:\n  limits:\n    memory: lots\n", []string{"at '/resources/limits/memory'", "does not match pattern"}},
		{"env var with value and valueFrom", "extraEnv:\n  - name: A\n    value: x\n    valueFrom: {fieldRef: {fieldPath: metadata.name}}\n", []string{"at '/extraEnv/0'", "'not' failed"}},
		{"bad pod label value", "podLabels:\n  tier: two words\n", []string{"at '/podLabels/tier'", "does not match pattern"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg := mustFail(t, valueSet{name: tt.name, extra: tt.values})
			for _, want := range append([]string{schemaError}, tt.want...) {
				if !strings.Contains(msg, want) {
					t.Errorf("got error:\n%s\nwant it to contain %q", msg, want)
				}
			}
		})
	}
}

// TestRenderRejectsInconsistentValues checks the rules that involve several
// values, which the templates enforce with an explanatory message.
func TestRenderRejectsInconsistentValues(t *testing.T) {
	t.Parallel()
	const redis = "backend: {type: redis, redis: {addrs: ['redis:6379']}}\n"
	tests := []struct {
		name   string
		values string
		want   []string // in helm's error; empty: the render succeeds
	}{
		{"one replica on memory", "replicaCount: 1\n", nil},
		{"scaled to zero on memory", "replicaCount: 0\n", nil},
		{"two replicas on memory", "replicaCount: 2\n", []string{
			"replicaCount=2 with backend.type=memory",
			"every replica would enforce its own limits",
			"up to 2 times each limit",
			"Set replicaCount to 1, or set backend.type=redis",
		}},
		{"five replicas on memory", "replicaCount: 5\n", []string{"replicaCount=5", "up to 5 times each limit", "set backend.type=redis"}},
		{"five replicas on redis", "replicaCount: 5\n" + redis, nil},
		{"autoscaler held at one replica", "autoscaling: {enabled: true, minReplicas: 1, maxReplicas: 1}\n", nil},
		{"autoscaler up to three replicas on memory", "autoscaling: {enabled: true, maxReplicas: 3}\n", []string{
			"autoscaling.maxReplicas=3 with backend.type=memory",
			"up to 3 times each limit",
			"Set autoscaling.maxReplicas to 1, or set backend.type=redis",
		}},
		{"autoscaler up to twenty replicas on redis", "autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 20}\n" + redis, nil},
		{"redis password twice", "backend: {type: redis, redis: {addrs: ['redis:6379'], password: a, existingSecret: b}}\n", []string{
			"backend.redis.password and backend.redis.existingSecret are both set: set one",
		}},
		{"redis CA without TLS", "backend: {type: redis, redis: {addrs: ['redis:6379'], tls: {caSecret: redis-ca}}}\n", []string{
			"backend.redis.tls.caSecret is set but backend.redis.tls.enabled is false",
		}},
		{"redis CA with TLS", "backend: {type: redis, redis: {addrs: ['redis:6379'], tls: {enabled: true, caSecret: redis-ca}}}\n", nil},
		{"extra env overrides a Redis setting", "extraEnv:\n  - {name: RATELIMITER_REDIS_ADDRS, value: 'a:1'}\n" + redis, []string{
			"extraEnv sets RATELIMITER_REDIS_ADDRS, which the chart sets",
		}},
		{"extra env sets the Redis password", "extraEnv:\n  - {name: RATELIMITER_REDIS_PASSWORD, valueFrom: {secretKeyRef: {name: r, key: p}}}\n" + redis, []string{
			"extraEnv sets RATELIMITER_REDIS_PASSWORD", "backend.redis.existingSecret",
		}},
		{"extra env sets a Redis setting on memory", "extraEnv:\n  - {name: RATELIMITER_REDIS_TLS, value: 'true'}\n", []string{
			"extraEnv sets RATELIMITER_REDIS_TLS", "backend.redis",
		}},
		{"autoscaler ignores replicaCount", "replicaCount: 2\nautoscaling: {enabled: true, maxReplicas: 1}\n", nil},
		{"autoscaler min above max", "autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 1}\n", []string{"autoscaling.minReplicas=2 is above autoscaling.maxReplicas=1"}},
		{"autoscaler without a target", "autoscaling: {enabled: true, targetCPUUtilizationPercentage: 0}\n", []string{"set at least one"}},
		{"readiness too slow for the delay", "shutdown: {delaySeconds: 4}\n", []string{
			"readinessProbe.periodSeconds (2) x readinessProbe.failureThreshold (2) = 4 seconds must be less than shutdown.delaySeconds (4)",
		}},
		{"readiness fast enough for the delay", "shutdown: {delaySeconds: 5}\n", nil},
		{"no shutdown delay", "shutdown: {delaySeconds: 0}\n", nil},
		{"admin token twice", "adminToken: {value: a, existingSecret: b}\n", []string{"adminToken.value and adminToken.existingSecret are both set"}},
		{"Envoy rules twice", "envoy: {existingConfigMap: mesh-rules, config: {web.yaml: 'domain: web'}}\n", []string{
			"envoy.config and envoy.existingConfigMap are both set: set one",
		}},
		{"gRPC on the HTTP container port", "grpc: {containerPort: 8080}\n", []string{"grpc.containerPort and containerPort are both 8080"}},
		{"gRPC on the HTTP Service port", "service: {port: 80, grpcPort: 80}\n", []string{"service.grpcPort and service.port are both 80"}},
		{"gRPC off on the HTTP ports", "grpc: {enabled: false, containerPort: 8080}\nservice: {grpcPort: 8080}\n", nil},
		{"extra env overrides the chart's", "extraEnv:\n  - {name: RATELIMITER_BACKEND, value: memory}\n", []string{"extraEnv sets RATELIMITER_BACKEND"}},
		{"extra env overrides an OTel setting", "otel: {tracesExporter: console}\nextraEnv:\n  - {name: OTEL_TRACES_SAMPLER, value: always_on}\n", []string{"extraEnv sets OTEL_TRACES_SAMPLER"}},
		{"extra env of its own", "extraEnv:\n  - {name: OTEL_EXPORTER_OTLP_HEADERS, value: a=b}\n", nil},
		{"duplicate limiter", "config:\n  limiters:\n    - {name: a, limit: 1, period: 1s}\n    - {name: a, limit: 2, period: 1s}\n", []string{
			`config.limiters[1]: duplicate name "a", first declared at config.limiters[0]`,
		}},
		{"limiter burst above its limit", "config:\n  limiters:\n    - {name: a, limit: 5, period: 1s, burst: 6}\n", []string{"config.limiters[0] (a): burst 6 is above the limit 5"}},
		{"more limiters than the maximum", "server: {maxLimiters: 2}\nconfig:\n  limiters:\n    - {name: a, limit: 1, period: 1s}\n    - {name: b, limit: 1, period: 1s}\n    - {name: c, limit: 1, period: 1s}\n", []string{
			"config.limiters declares 3 limiters, more than server.maxLimiters=2",
		}},
		{"as many limiters as the maximum", "server: {maxLimiters: 2}\nconfig:\n  limiters:\n    - {name: a, limit: 1, period: 1s}\n    - {name: b, limit: 1, period: 1s}\n", nil},
		{"keyed limiters past the budget of keys", "config:\n  limiters:\n" +
			"    - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 995000}\n" +
			"    - {name: b, limit: 1, period: 1s, keyed: true}\n", []string{
			"config.limiters: the max_keys of the keyed limiters add up to 1005000 (10000 for each that leaves it out), more than the 1000000 keys",
			"the service would refuse to start",
		}},
		{"keyed limiters at the budget of keys", "config:\n  limiters:\n" +
			"    - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 990000}\n" +
			"    - {name: b, limit: 1, period: 1s, keyed: true}\n    - {name: c, limit: 1, period: 1s}\n", nil},
		{"keyed limiters past the budget of keys on redis", redis + "config:\n  limiters:\n" +
			"    - {name: a, limit: 1, period: 1s, keyed: true, max_keys: 10000000}\n" +
			"    - {name: b, limit: 1, period: 1s, keyed: true}\n", []string{"add up to 10010000"}},
		{"per-IP burst above the limit", "config:\n  tenants: {limit: 5, burst: 6}\n", []string{"config.tenants: burst 6 is above the limit 5"}},
		{"disruption budget both ways", "podDisruptionBudget: {minAvailable: 1, maxUnavailable: 1}\n", []string{"set one"}},
		{"disruption budget neither way", "podDisruptionBudget: {minAvailable: \"\", maxUnavailable: \"\"}\n", []string{"neither minAvailable nor maxUnavailable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vs := valueSet{name: tt.name, extra: tt.values}
			if tt.want == nil {
				render(t, vs)
				return
			}
			msg := mustFail(t, vs)
			for _, want := range tt.want {
				if !strings.Contains(msg, want) {
					t.Errorf("got error:\n%s\nwant it to contain %q", msg, want)
				}
			}
		})
	}
}

// TestTerminationGracePeriod checks that Kubernetes waits at least the
// shutdown delay plus the shutdown timeout before it kills a pod.
func TestTerminationGracePeriod(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		values  string
		want    int64
		wantErr string
	}{
		{name: "derived from the defaults", values: "", want: 10 + 20 + 5},
		{name: "derived from the shutdown values", values: "shutdown: {delaySeconds: 30, timeoutSeconds: 60}\n", want: 30 + 60 + 5},
		{name: "derived without a delay", values: "shutdown: {delaySeconds: 0, timeoutSeconds: 1}\n", want: 0 + 1 + 5},
		{name: "set above the minimum", values: "terminationGracePeriodSeconds: 120\n", want: 120},
		{name: "set to the minimum", values: "terminationGracePeriodSeconds: 35\n", want: 35},
		{name: "set below the minimum", values: "terminationGracePeriodSeconds: 34\n",
			wantErr: "terminationGracePeriodSeconds=34 is too short: shutdown.delaySeconds (10) + shutdown.timeoutSeconds (20) + 5 seconds to exit need at least 35"},
		{name: "below after the timeout grew", values: "terminationGracePeriodSeconds: 60\nshutdown: {timeoutSeconds: 50}\n",
			wantErr: "need at least 65"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vs := valueSet{name: tt.name, extra: tt.values}
			if tt.wantErr != "" {
				if msg := mustFail(t, vs); !strings.Contains(msg, tt.wantErr) {
					t.Errorf("got error:\n%s\nwant it to contain %q", msg, tt.wantErr)
				}
				return
			}
			m := render(t, vs)
			got := deref(m.Deployment.Spec.Template.Spec.TerminationGracePeriodSeconds)
			if got != tt.want {
				t.Fatalf("terminationGracePeriodSeconds: got %v, want %d", got, tt.want)
			}
			cfg, _ := serviceConfig(t, m)
			if grace := float64(tt.want); grace < (cfg.ShutdownDelay + cfg.ShutdownTimeout).Seconds() {
				t.Errorf("terminationGracePeriodSeconds %v is less than the service's shutdown delay %s + timeout %s",
					got, cfg.ShutdownDelay, cfg.ShutdownTimeout)
			}
		})
	}
}
