{{/*
The chart's name, or nameOverride. Truncated to 63 characters: some
Kubernetes name fields are limited to that (the DNS label rule).
*/}}
{{- define "ratelimiter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, or the release name
when it already contains the chart name, or <release>-<name>; at most 63
characters.
*/}}
{{- define "ratelimiter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The chart's name and version, as the helm.sh/chart label holds them.
*/}}
{{- define "ratelimiter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels every object of the release carries.
*/}}
{{- define "ratelimiter.labels" -}}
helm.sh/chart: {{ include "ratelimiter.chart" . }}
{{ include "ratelimiter.selectorLabels" . }}
app.kubernetes.io/version: {{ include "ratelimiter.imageTag" . | trunc 63 | trimAll "-_." | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The labels that select the release's service pods: the Deployment's selector,
the Service, the PodDisruptionBudget and the NetworkPolicy use them. The helm
test pod must not carry both, or the Deployment's ReplicaSet would adopt it.
*/}}
{{- define "ratelimiter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ratelimiter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The labels of the helm test pod: the release's, without the name label the
selector uses.
*/}}
{{- define "ratelimiter.testLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end }}

{{/*
The name of the ServiceAccount the pods run as.
*/}}
{{- define "ratelimiter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ratelimiter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image tag: image.tag, or the chart's appVersion.
*/}}
{{- define "ratelimiter.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
The image reference: repository:tag, with @digest when a digest is set.
*/}}
{{- define "ratelimiter.image" -}}
{{- $ref := printf "%s:%s" .Values.image.repository (include "ratelimiter.imageTag" .) }}
{{- with .Values.image.digest }}
{{- $ref = printf "%s@%s" $ref . }}
{{- end }}
{{- $ref }}
{{- end }}

{{/*
The name of the Secret holding the admin token, empty when none is
configured.
*/}}
{{- define "ratelimiter.adminTokenSecret" -}}
{{- if .Values.adminToken.existingSecret }}
{{- .Values.adminToken.existingSecret }}
{{- else if .Values.adminToken.value }}
{{- printf "%s-admin-token" (include "ratelimiter.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The key of the admin token in its Secret.
*/}}
{{- define "ratelimiter.adminTokenKey" -}}
{{- if .Values.adminToken.existingSecret }}
{{- .Values.adminToken.existingSecretKey }}
{{- else }}
{{- "admin-token" }}
{{- end }}
{{- end }}

{{/*
The name of the Secret holding the Redis password, empty when the redis
backend is off or has no password.
*/}}
{{- define "ratelimiter.redisPasswordSecret" -}}
{{- $r := .Values.backend.redis }}
{{- if eq .Values.backend.type "redis" }}
{{- if $r.existingSecret }}
{{- $r.existingSecret }}
{{- else if $r.password }}
{{- printf "%s-redis" (include "ratelimiter.fullname" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The key of the Redis password in its Secret.
*/}}
{{- define "ratelimiter.redisPasswordKey" -}}
{{- if .Values.backend.redis.existingSecret }}
{{- .Values.backend.redis.existingSecretKey }}
{{- else }}
{{- "redis-password" }}
{{- end }}
{{- end }}

{{/*
The name of the Secret holding the Redis CA certificates, empty when none
is mounted.
*/}}
{{- define "ratelimiter.redisCASecret" -}}
{{- $r := .Values.backend.redis }}
{{- if and (eq .Values.backend.type "redis") $r.tls.enabled }}
{{- $r.tls.caSecret }}
{{- end }}
{{- end }}

{{/*
The ports of backend.redis.addrs, without repeats and in order, as a JSON
list of numbers.
*/}}
{{- define "ratelimiter.redisPorts" -}}
{{- $ports := list }}
{{- range .Values.backend.redis.addrs }}
{{- $ports = append $ports (int (regexFind "[0-9]+$" .)) }}
{{- end }}
{{- $ports | uniq | toJson }}
{{- end }}

{{/*
The name of the ConfigMap holding the Envoy rate limit configuration:
envoy.existingConfigMap, or the chart's own when envoy.config is set; empty
when there is none.
*/}}
{{- define "ratelimiter.envoyConfigMap" -}}
{{- if .Values.envoy.existingConfigMap }}
{{- .Values.envoy.existingConfigMap }}
{{- else if .Values.envoy.config }}
{{- printf "%s-envoy" (include "ratelimiter.fullname" .) }}
{{- end }}
{{- end }}

{{/*
Where the pods find their files.
*/}}
{{- define "ratelimiter.configDir" -}}/etc/ratelimiter/config{{- end }}
{{- define "ratelimiter.envoyConfigDir" -}}/etc/ratelimiter/envoy{{- end }}
{{- define "ratelimiter.adminTokenDir" -}}/etc/ratelimiter/admin-token{{- end }}
{{- define "ratelimiter.tokensDir" -}}/etc/ratelimiter/tokens{{- end }}
{{- define "ratelimiter.tlsDir" -}}/etc/ratelimiter/tls{{- end }}
{{- define "ratelimiter.redisPasswordDir" -}}/etc/ratelimiter/redis-password{{- end }}
{{- define "ratelimiter.redisCADir" -}}/etc/ratelimiter/redis-ca{{- end }}
{{- define "ratelimiter.dataDir" -}}/var/lib/ratelimiter{{- end }}

{{/*
The name of the PersistentVolumeClaim mounted at the data directory:
persistence.existingClaim, or the chart's own; empty when persistence is
off.
*/}}
{{- define "ratelimiter.dataClaim" -}}
{{- if .Values.persistence.enabled }}
{{- default (printf "%s-data" (include "ratelimiter.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the value set, or the shutdown delay and
timeout plus a margin for the process to exit.
*/}}
{{- define "ratelimiter.minTerminationGracePeriodSeconds" -}}
{{- add .Values.shutdown.delaySeconds .Values.shutdown.timeoutSeconds 5 }}
{{- end }}
{{- define "ratelimiter.terminationGracePeriodSeconds" -}}
{{- if .Values.terminationGracePeriodSeconds }}
{{- int64 .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- include "ratelimiter.minTerminationGracePeriodSeconds" . }}
{{- end }}
{{- end }}

{{/*
The port of the OTLP endpoint: the one in otel.endpoint, or its scheme's
default. Empty when no endpoint is set.
*/}}
{{- define "ratelimiter.otlpPort" -}}
{{- with .Values.otel.endpoint }}
{{- $url := urlParse . }}
{{- $port := regexFind "[0-9]+$" (regexFind ":[0-9]+$" $url.host) }}
{{- if $port }}
{{- $port }}
{{- else if eq $url.scheme "https" }}
{{- 443 }}
{{- else }}
{{- 80 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The environment of the service container, as a YAML list. The names it sets
are listed in ratelimiter.envNames, which extraEnv may not reuse.
*/}}
{{- define "ratelimiter.env" -}}
- name: RATELIMITER_LISTEN
  value: {{ printf ":%d" (int .Values.containerPort) | quote }}
- name: RATELIMITER_BACKEND
  value: {{ .Values.backend.type | quote }}
{{- if .Values.persistence.enabled }}
- name: RATELIMITER_DATA_DIR
  value: {{ include "ratelimiter.dataDir" . | quote }}
{{- end }}
- name: RATELIMITER_CONFIG
  value: {{ printf "%s/config.yaml" (include "ratelimiter.configDir" .) | quote }}
{{- /* Empty when gRPC is off. The service reads an empty variable as unset,
so the Deployment also passes --grpc-listen= then. */}}
- name: RATELIMITER_GRPC_LISTEN
  value: {{ ternary (printf ":%d" (int .Values.grpc.containerPort)) "" .Values.grpc.enabled | quote }}
{{- if include "ratelimiter.envoyConfigMap" . }}
{{- /* The directory, which the service watches for changes. */}}
- name: RATELIMITER_ENVOY_CONFIG
  value: {{ include "ratelimiter.envoyConfigDir" . | quote }}
{{- end }}
- name: RATELIMITER_ENVOY_HEADERS
  value: {{ ternary "true" "false" .Values.envoy.headers | quote }}
- name: RATELIMITER_TRUSTED_PROXIES
  value: {{ join "," .Values.forwardAuth.trustedProxies | quote }}
- name: RATELIMITER_TRUSTED_HOPS
  value: {{ int .Values.forwardAuth.trustedHops | quote }}
- name: RATELIMITER_FORWARDED_HEADER
  value: {{ .Values.forwardAuth.forwardedHeader | quote }}
{{- if include "ratelimiter.adminTokenSecret" . }}
- name: RATELIMITER_ADMIN_TOKEN_FILE
  value: {{ printf "%s/token" (include "ratelimiter.adminTokenDir" .) | quote }}
{{- end }}
{{- if eq .Values.backend.type "redis" }}
{{- $r := .Values.backend.redis }}
- name: RATELIMITER_REDIS_ADDRS
  value: {{ join "," $r.addrs | quote }}
{{- with $r.username }}
- name: RATELIMITER_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- /* The password only ever reaches the pod as a mounted file. */}}
{{- if include "ratelimiter.redisPasswordSecret" . }}
- name: RATELIMITER_REDIS_PASSWORD_FILE
  value: {{ printf "%s/password" (include "ratelimiter.redisPasswordDir" .) | quote }}
{{- end }}
- name: RATELIMITER_REDIS_TLS
  value: {{ ternary "true" "false" $r.tls.enabled | quote }}
{{- if include "ratelimiter.redisCASecret" . }}
- name: RATELIMITER_REDIS_TLS_CA_FILE
  value: {{ printf "%s/ca.crt" (include "ratelimiter.redisCADir" .) | quote }}
{{- end }}
- name: RATELIMITER_REDIS_KEY_PREFIX
  value: {{ $r.keyPrefix | quote }}
- name: RATELIMITER_REDIS_TIMEOUT
  value: {{ $r.timeout | quote }}
- name: RATELIMITER_REDIS_DIAL_TIMEOUT
  value: {{ $r.dialTimeout | quote }}
- name: RATELIMITER_REDIS_CONNS_PER_NODE
  value: {{ int $r.connsPerNode | quote }}
- name: RATELIMITER_REDIS_DENY_CACHE
  value: {{ int $r.denyCache | quote }}
- name: RATELIMITER_REDIS_FAILURE_MODE
  value: {{ $r.failureMode | quote }}
{{- end }}
- name: RATELIMITER_MAX_CONNECTIONS
  value: {{ int64 .Values.server.maxConnections | quote }}
{{- if .Values.grpc.enabled }}
- name: RATELIMITER_GRPC_MAX_CONNECTIONS
  value: {{ int64 .Values.grpc.maxConnections | quote }}
- name: RATELIMITER_GRPC_MAX_MESSAGE_BYTES
  value: {{ .Values.grpc.maxMessageBytes | quote }}
- name: RATELIMITER_GRPC_MAX_STREAMS
  value: {{ int64 .Values.grpc.maxStreams | quote }}
- name: RATELIMITER_GRPC_IDLE_TIMEOUT
  value: {{ .Values.grpc.idleTimeout | quote }}
{{- end }}
- name: RATELIMITER_MAX_BODY_BYTES
  value: {{ int64 .Values.server.maxBodyBytes | quote }}
- name: RATELIMITER_MAX_HEADER_BYTES
  value: {{ int64 .Values.server.maxHeaderBytes | quote }}
- name: RATELIMITER_MAX_LIMITERS
  value: {{ int64 .Values.server.maxLimiters | quote }}
- name: RATELIMITER_GC_MIN_HEAP
  value: {{ int64 .Values.server.gcMinHeapBytes | quote }}
- name: RATELIMITER_METRICS_MAX_LIMITERS
  value: {{ int64 .Values.metrics.maxLimiters | quote }}
- name: RATELIMITER_READ_HEADER_TIMEOUT
  value: {{ .Values.server.readHeaderTimeout | quote }}
- name: RATELIMITER_READ_TIMEOUT
  value: {{ .Values.server.readTimeout | quote }}
- name: RATELIMITER_WRITE_TIMEOUT
  value: {{ .Values.server.writeTimeout | quote }}
- name: RATELIMITER_IDLE_TIMEOUT
  value: {{ .Values.server.idleTimeout | quote }}
- name: RATELIMITER_SHUTDOWN_DELAY
  value: {{ printf "%ds" (int64 .Values.shutdown.delaySeconds) | quote }}
- name: RATELIMITER_SHUTDOWN_TIMEOUT
  value: {{ printf "%ds" (int64 .Values.shutdown.timeoutSeconds) | quote }}
- name: RATELIMITER_LOG_LEVEL
  value: {{ .Values.log.level | quote }}
- name: RATELIMITER_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
- name: OTEL_TRACES_EXPORTER
  value: {{ .Values.otel.tracesExporter | quote }}
{{- if ne .Values.otel.tracesExporter "none" }}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
{{- end }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .Values.otel.protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .Values.otel.sampler | quote }}
{{- if ne (toString .Values.otel.samplerArg) "" }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ toString .Values.otel.samplerArg | quote }}
{{- end }}
{{- with .Values.otel.serviceName }}
- name: OTEL_SERVICE_NAME
  value: {{ . | quote }}
{{- end }}
- name: K8S_NAMESPACE_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- /* Kubernetes expands $(VAR) from the variables defined above. */}}
{{- $attrs := list "k8s.namespace.name=$(K8S_NAMESPACE_NAME)" "k8s.pod.name=$(K8S_POD_NAME)" }}
{{- range $k, $v := .Values.otel.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%s" $k $v) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- end }}
{{- end }}

{{/*
Checks the rules that involve several values, which the schema cannot
express. Included by the Deployment, so every render runs it.
*/}}
{{- define "ratelimiter.validate" -}}
{{- $v := .Values }}
{{- if $v.persistence.enabled }}
{{- if eq $v.backend.type "redis" }}
{{- fail "persistence.enabled with backend.type=redis: persistence keeps the memory backend's data directory, and the service refuses a data directory with the redis backend, whose state Redis keeps (persist Redis itself, with AOF or RDB snapshots on its own volume). Set persistence.enabled=false, or backend.type=memory." }}
{{- end }}
{{- if $v.autoscaling.enabled }}
{{- fail "persistence.enabled with autoscaling.enabled: the data directory is one volume that one pod at a time may use (its file is locked by the process that opens it), and the memory backend is for a single replica. Turn the autoscaler off and set replicaCount to 1, or turn persistence off." }}
{{- end }}
{{- if gt (int $v.replicaCount) 1 }}
{{- fail (printf "replicaCount=%d with persistence.enabled: the data directory is one volume that one pod at a time may use (its file is locked by the process that opens it), and the memory backend is for a single replica. Set replicaCount to 1, or turn persistence off (and set backend.type=redis to run several replicas)." (int $v.replicaCount)) }}
{{- end }}
{{- if not (and $v.podSecurityContext (hasKey $v.podSecurityContext "fsGroup")) }}
{{- fail "persistence.enabled without podSecurityContext.fsGroup: a new volume's directory belongs to root, and the kubelet makes it writable for the pod's non-root user only through the pod's fsGroup. Set podSecurityContext.fsGroup (the chart's default is 65532)." }}
{{- end }}
{{- end }}
{{- if eq $v.backend.type "memory" }}
{{- if and (not $v.autoscaling.enabled) (gt (int $v.replicaCount) 1) }}
{{- fail (printf "replicaCount=%d with backend.type=memory: the memory backend keeps limiter state inside each pod, so every replica would enforce its own limits and callers could get up to %d times each limit. Set replicaCount to 1, or set backend.type=redis (and backend.redis.addrs) so that every replica shares one state in Redis." (int $v.replicaCount) (int $v.replicaCount)) }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.maxReplicas) 1) }}
{{- fail (printf "autoscaling.maxReplicas=%d with backend.type=memory: the memory backend keeps limiter state inside each pod, so every replica would enforce its own limits and callers could get up to %d times each limit. Set autoscaling.maxReplicas to 1, or set backend.type=redis (and backend.redis.addrs) so that every replica shares one state in Redis." (int $v.autoscaling.maxReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- end }}
{{- end }}
{{- $r := $v.backend.redis }}
{{- if and $r.password $r.existingSecret }}
{{- fail "backend.redis.password and backend.redis.existingSecret are both set: set one" }}
{{- end }}
{{- if and $r.tls.caSecret (not $r.tls.enabled) }}
{{- fail "backend.redis.tls.caSecret is set but backend.redis.tls.enabled is false: enable TLS, or unset caSecret" }}
{{- end }}
{{- if $v.autoscaling.enabled }}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) }}
{{- fail (printf "autoscaling.minReplicas=%d is above autoscaling.maxReplicas=%d" (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- end }}
{{- if not (or $v.autoscaling.targetCPUUtilizationPercentage $v.autoscaling.targetMemoryUtilizationPercentage) }}
{{- fail "autoscaling is enabled but both autoscaling.targetCPUUtilizationPercentage and autoscaling.targetMemoryUtilizationPercentage are 0: set at least one" }}
{{- end }}
{{- end }}
{{- $min := int (include "ratelimiter.minTerminationGracePeriodSeconds" .) }}
{{- if and $v.terminationGracePeriodSeconds (lt (int $v.terminationGracePeriodSeconds) $min) }}
{{- fail (printf "terminationGracePeriodSeconds=%d is too short: shutdown.delaySeconds (%d) + shutdown.timeoutSeconds (%d) + 5 seconds to exit need at least %d, or Kubernetes kills the pod while it still drains requests. Raise it, or set it to 0 to derive it." (int $v.terminationGracePeriodSeconds) (int $v.shutdown.delaySeconds) (int $v.shutdown.timeoutSeconds) $min) }}
{{- end }}
{{- $notReadyAfter := mul $v.readinessProbe.periodSeconds $v.readinessProbe.failureThreshold }}
{{- if and $v.shutdown.delaySeconds (ge (int $notReadyAfter) (int $v.shutdown.delaySeconds)) }}
{{- fail (printf "readinessProbe.periodSeconds (%d) x readinessProbe.failureThreshold (%d) = %d seconds must be less than shutdown.delaySeconds (%d): otherwise the pod closes its listener before the readiness probe has taken it out of the Service. Shorten the probe or lengthen the delay." (int $v.readinessProbe.periodSeconds) (int $v.readinessProbe.failureThreshold) (int $notReadyAfter) (int $v.shutdown.delaySeconds)) }}
{{- end }}
{{- if and $v.tls.clientAuth (not $v.tls.existingSecret) }}
{{- fail "tls.clientAuth is true but tls.existingSecret is empty: client certificates are checked against the ca.crt of the TLS Secret. Set tls.existingSecret, or tls.clientAuth=false" }}
{{- end }}
{{- if and $v.adminToken.value $v.adminToken.existingSecret }}
{{- fail "adminToken.value and adminToken.existingSecret are both set: set one" }}
{{- end }}
{{- if and $v.envoy.config $v.envoy.existingConfigMap }}
{{- fail "envoy.config and envoy.existingConfigMap are both set: set one (the rules in the values, or the name of a ConfigMap holding them)" }}
{{- end }}
{{- if $v.grpc.enabled }}
{{- if eq (int $v.grpc.containerPort) (int $v.containerPort) }}
{{- fail (printf "grpc.containerPort and containerPort are both %d: HTTP and gRPC need a port each" (int $v.containerPort)) }}
{{- end }}
{{- if eq (int $v.service.grpcPort) (int $v.service.port) }}
{{- fail (printf "service.grpcPort and service.port are both %d: the Service needs a port each for HTTP and gRPC" (int $v.service.port)) }}
{{- end }}
{{- end }}
{{- if and $v.podDisruptionBudget.enabled (ne (toString $v.podDisruptionBudget.minAvailable) "") (ne (toString $v.podDisruptionBudget.maxUnavailable) "") }}
{{- fail "podDisruptionBudget.minAvailable and podDisruptionBudget.maxUnavailable are both set: set one, and the other to \"\"" }}
{{- end }}
{{- if and $v.podDisruptionBudget.enabled (eq (toString $v.podDisruptionBudget.minAvailable) "") (eq (toString $v.podDisruptionBudget.maxUnavailable) "") }}
{{- fail "podDisruptionBudget is enabled but neither minAvailable nor maxUnavailable is set" }}
{{- end }}
{{- $names := list }}
{{- range (include "ratelimiter.env" . | fromYamlArray) }}
{{- $names = append $names .name }}
{{- end }}
{{- range $v.extraEnv }}
{{- if has .name $names }}
{{- fail (printf "extraEnv sets %s, which the chart sets from its values: set the matching value instead" .name) }}
{{- end }}
{{- if eq .name "RATELIMITER_DATA_DIR" }}
{{- fail "extraEnv sets RATELIMITER_DATA_DIR: the root file system is read-only, so the data directory must be a volume; set persistence.enabled (the chart then sets it to the volume's mount)" }}
{{- end }}
{{- if hasPrefix "RATELIMITER_REDIS_" .name }}
{{- fail (printf "extraEnv sets %s: the Redis settings come from backend.redis (the password from a mounted Secret, backend.redis.existingSecret): set them there" .name) }}
{{- end }}
{{- end }}
{{- $seen := dict }}
{{- range $i, $l := $v.config.limiters }}
{{- if hasKey $seen $l.name }}
{{- fail (printf "config.limiters[%d]: duplicate name %q, first declared at config.limiters[%v]" $i $l.name (get $seen $l.name)) }}
{{- end }}
{{- $_ := set $seen $l.name (toString $i) }}
{{- if gt (int64 ($l.burst | default 0)) (int64 $l.limit) }}
{{- fail (printf "config.limiters[%d] (%s): burst %d is above the limit %d" $i $l.name (int64 $l.burst) (int64 $l.limit)) }}
{{- end }}
{{- end }}
{{- $keys := 0 }}
{{- range $v.config.limiters }}
{{- if .keyed }}
{{- $keys = add $keys (int64 (.max_keys | default 10000)) }}
{{- end }}
{{- end }}
{{- if gt (int64 $keys) 1000000 }}
{{- fail (printf "config.limiters: the max_keys of the keyed limiters add up to %d (10000 for each that leaves it out), more than the 1000000 keys the keyed limiters may hold together: the service would refuse to start. Lower max_keys." (int64 $keys)) }}
{{- end }}
{{- if gt (len $v.config.limiters) (int $v.server.maxLimiters) }}
{{- fail (printf "config.limiters declares %d limiters, more than server.maxLimiters=%d: the service would refuse to start. Raise server.maxLimiters, or declare fewer." (len $v.config.limiters) (int $v.server.maxLimiters)) }}
{{- end }}
{{- if gt (int64 $v.config.tenants.burst) (int64 $v.config.tenants.limit) }}
{{- fail (printf "config.tenants: burst %d is above the limit %d" (int64 $v.config.tenants.burst) (int64 $v.config.tenants.limit)) }}
{{- end }}
{{- end }}

{{/*
The PromQL label matchers, without braces, that select the release's series
in the alert rules: metrics.prometheusRule.selector, or the namespace and job
labels a ServiceMonitor gives the scraped series (job is the Service's name).
*/}}
{{- define "ratelimiter.alertSelector" -}}
{{- with .Values.metrics.prometheusRule.selector }}
{{- . }}
{{- else }}
{{- printf "namespace=%q,job=%q" .Release.Namespace (include "ratelimiter.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The service's arguments. The tokens file and the TLS files are passed as
flags rather than RATELIMITER_* variables: an image that does not know
them refuses to start ("flag provided but not defined"), where it would
ignore a variable and serve with every scope open, or in plain text.
*/}}
{{- define "ratelimiter.args" -}}
{{- if not .Values.grpc.enabled }}
{{- /* The service reads an empty RATELIMITER_GRPC_LISTEN as unset, and
would serve gRPC on its default port: the empty flag turns it off. */}}
- --grpc-listen=
{{- end }}
{{- if .Values.tokens.existingSecret }}
- {{ printf "--tokens-file=%s/tokens.yaml" (include "ratelimiter.tokensDir" .) }}
{{- end }}
{{- if .Values.tls.existingSecret }}
- {{ printf "--tls-cert-file=%s/tls.crt" (include "ratelimiter.tlsDir" .) }}
- {{ printf "--tls-key-file=%s/tls.key" (include "ratelimiter.tlsDir" .) }}
{{- if .Values.tls.clientAuth }}
- {{ printf "--tls-client-ca-file=%s/ca.crt" (include "ratelimiter.tlsDir" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The scheme of the HTTP listener: https with tls.existingSecret.
*/}}
{{- define "ratelimiter.scheme" -}}
{{- ternary "https" "http" (not (empty .Values.tls.existingSecret)) }}
{{- end }}
