{{/*
Names and labels.
*/}}
{{- define "skyport.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "skyport.fullname" -}}
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

{{- define "skyport.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of a component: (dict "root" $ "component" "gateway"). */}}
{{- define "skyport.selectorLabels" -}}
app.kubernetes.io/name: {{ include "skyport.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of a component's objects: (dict "root" $ "component" "gateway"). */}}
{{- define "skyport.labels" -}}
helm.sh/chart: {{ include "skyport.chart" .root }}
{{ include "skyport.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: skyport
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* "embedded" (the all-in-one) or "split" (gateway + worker: profile azure or kafka), from config.profile. */}}
{{- define "skyport.shape" -}}
{{- $profile := (.Values.config | default dict).profile | default "embedded" }}
{{- if or (eq $profile "azure") (eq $profile "kafka") }}split{{ else }}embedded{{ end }}
{{- end }}

{{- define "skyport.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "skyport.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image of a component: (dict "root" $ "image" .Values.gateway.image). */}}
{{- define "skyport.image" -}}
{{- $repository := .image.repository }}
{{- with .root.Values.imageRegistry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
{{- printf "%s:%s" $repository (.image.tag | default .root.Chart.AppVersion) }}
{{- end }}

{{/* The secret the SKYPORT__… secret variables come from. */}}
{{- define "skyport.secretName" -}}
{{- .Values.existingSecret | default (include "skyport.fullname" .) }}
{{- end }}

{{/*
The configuration file: .Values.config with the keys the chart owns (listen
addresses on 0.0.0.0 so probes and Services reach the processes, and the data
directory on the volume), as TOML. Helm reads numbers in values as floats, so
toToml writes 30000 as 30000.0, which an integer key refuses: whole numbers are
written back as integers (a float key takes an integer as well).
*/}}
{{- define "skyport.configToml" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- $gateway := get $config "gateway" | default dict }}
{{- $_ := set $gateway "listen" "0.0.0.0:8080" }}
{{- $_ := set $config "gateway" $gateway }}
{{- if eq (include "skyport.shape" .) "split" }}
{{- $worker := get $config "worker" | default dict }}
{{- $_ := set $worker "listen" "0.0.0.0:9090" }}
{{- $_ := set $config "worker" $worker }}
{{- else }}
{{- $embedded := get $config "embedded" | default dict }}
{{- $_ := set $embedded "data_dir" "/data" }}
{{- $_ := set $config "embedded" $embedded }}
{{- end }}
{{- $toml := regexReplaceAll `(?m)= (-?[0-9]+)\.0$` (toToml $config) "= ${1}" }}
{{- printf "# skyport.toml, rendered by the %s chart from .Values.config.\n%s\n" (include "skyport.chart" .) (trim $toml) }}
{{- end }}

{{/*
The secret values and where they go, as JSON {"entries": [{key, env, value,
optional}]}: with existingSecret every known key (optional but for the receipt
key with profile azure or kafka, the callback secrets when config.callbacks.enabled
is true there, and the listed API keys), else the values set in `secrets`. The
callback secrets are one value, the list in brackets with each secret quoted
(["whsec_…", "whsec_…"]): the form the binaries read a list from one variable in.
*/}}
{{- define "skyport.secretEntries" -}}
{{- $fixed := list
  (list "receiptKey" "receipt-key" "SKYPORT__GATEWAY__RECEIPT_KEY")
  (list "cosmosKey" "cosmos-key" "SKYPORT__COSMOS__KEY")
  (list "eventhubsConnectionString" "eventhubs-connection-string" "SKYPORT__EVENTHUBS__CONNECTION_STRING")
  (list "kafkaConnectionString" "kafka-connection-string" "SKYPORT__KAFKA__CONNECTION_STRING")
  (list "kafkaSaslPassword" "kafka-sasl-password" "SKYPORT__KAFKA__SASL_PASSWORD")
  (list "jwtHs256Secret" "jwt-hs256-secret" "SKYPORT__GATEWAY__AUTH__JWT__HS256_SECRET") }}
{{- $split := eq (include "skyport.shape" .) "split" }}
{{- $callbacks := get (.Values.config | default dict) "callbacks" | default dict }}
{{- $callbacksOn := and (hasKey $callbacks "enabled") (eq (toString (get $callbacks "enabled")) "true") }}
{{- $entries := list }}
{{- if .Values.existingSecret }}
{{- range $fixed }}
{{- $required := and $split (eq (index . 1) "receipt-key") }}
{{- $entries = append $entries (dict "key" (index . 1) "env" (index . 2) "value" "" "optional" (not $required)) }}
{{- end }}
{{- $entries = append $entries (dict "key" "callback-secrets" "env" "SKYPORT__CALLBACKS__SECRETS" "value" "" "optional" (not (and $split $callbacksOn))) }}
{{- range .Values.existingSecretApiKeys }}
{{- $entries = append $entries (dict "key" (printf "api-key-%s" .) "env" (printf "SKYPORT__GATEWAY__AUTH__API_KEYS__%s__KEY" (upper .)) "value" "" "optional" false) }}
{{- end }}
{{- else }}
{{- range $entry := $fixed }}
{{- with get $.Values.secrets (index $entry 0) }}
{{- $entries = append $entries (dict "key" (index $entry 1) "env" (index $entry 2) "value" . "optional" false) }}
{{- end }}
{{- end }}
{{- with .Values.secrets.callbackSecrets }}
{{- $entries = append $entries (dict "key" "callback-secrets" "env" "SKYPORT__CALLBACKS__SECRETS" "value" (toJson .) "optional" false) }}
{{- end }}
{{- range $name, $key := .Values.secrets.apiKeys }}
{{- $entries = append $entries (dict "key" (printf "api-key-%s" $name) "env" (printf "SKYPORT__GATEWAY__AUTH__API_KEYS__%s__KEY" (upper $name)) "value" $key "optional" false) }}
{{- end }}
{{- end }}
{{- dict "entries" $entries | toJson }}
{{- end }}

{{/*
terminationGracePeriodSeconds of a component: (dict "root" $ "component"
"gateway" "key" "gateway" "values" .Values.gateway), key naming its values.
It must be longer than what the process may take once the pod is told to
stop: the preStop sleep, then its shutdown grace period(s) after SIGTERM (the
all-in-one's gateway and worker drain in turn at worst). Unset: that plus 15 s.
*/}}
{{- define "skyport.terminationGracePeriod" -}}
{{- $config := .root.Values.config | default dict }}
{{- $gatewayConfig := get $config "gateway" | default dict }}
{{- $workerConfig := get $config "worker" | default dict }}
{{- $gatewayGrace := ternary (get $gatewayConfig "shutdown_grace_period_ms") 10000 (hasKey $gatewayConfig "shutdown_grace_period_ms") | int64 }}
{{- $workerGrace := ternary (get $workerConfig "shutdown_grace_period_ms") 30000 (hasKey $workerConfig "shutdown_grace_period_ms") | int64 }}
{{- $preStop := .values.preStopSleepSeconds | default 0 | int64 }}
{{- $needMs := 0 }}
{{- $what := "" }}
{{- if eq .component "worker" }}
{{- $needMs = $workerGrace }}
{{- $what = printf "config.worker.shutdown_grace_period_ms (%d ms)" $workerGrace }}
{{- else if eq .component "gateway" }}
{{- $needMs = add (mul $preStop 1000) $gatewayGrace }}
{{- $what = printf "gateway.preStopSleepSeconds (%d s) + config.gateway.shutdown_grace_period_ms (%d ms)" $preStop $gatewayGrace }}
{{- else }}
{{- $needMs = add (mul $preStop 1000) $gatewayGrace $workerGrace }}
{{- $what = printf "allInOne.preStopSleepSeconds (%d s) + config.gateway.shutdown_grace_period_ms (%d ms) + config.worker.shutdown_grace_period_ms (%d ms)" $preStop $gatewayGrace $workerGrace }}
{{- end }}
{{- $given := .values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $given }}
{{- add (div (add $needMs 999) 1000) 15 }}
{{- else if le (mul ($given | int64) 1000) $needMs }}
{{- fail (printf "%s.terminationGracePeriodSeconds (%d s) must be longer than %s = %d ms, or Kubernetes kills the %s before it has drained; raise it, or leave it empty to get %d" .key ($given | int64) $what $needMs .component (add (div (add $needMs 999) 1000) 15)) }}
{{- else }}
{{- $given | int64 }}
{{- end }}
{{- end }}

{{/*
Checks what the schema cannot; included by the ConfigMap, which every install renders.
*/}}
{{- define "skyport.validate" -}}
{{- $config := .Values.config | default dict }}
{{- $gateway := get $config "gateway" | default dict }}
{{- $auth := get $gateway "auth" | default dict }}
{{- $jwt := get $auth "jwt" | default dict }}
{{- $worker := get $config "worker" | default dict }}
{{- $embedded := get $config "embedded" | default dict }}
{{- $cosmos := get $config "cosmos" | default dict }}
{{- $eventhubs := get $config "eventhubs" | default dict }}
{{- $kafka := get $config "kafka" | default dict }}
{{- $profile := get $config "profile" | default "embedded" }}
{{- $stream := get $config "stream" | default dict }}
{{- $store := get $config "store" | default dict }}
{{- $services := get $config "services" | default dict }}
{{- $callbacks := get $config "callbacks" | default dict }}
{{- range $key, $section := dict "config.gateway.listen" $gateway "config.worker.listen" $worker "config.embedded.data_dir" $embedded }}
{{- if hasKey $section (last (splitList "." $key)) }}
{{- fail (printf "%s is set by the chart (listen addresses 0.0.0.0:8080 and 0.0.0.0:9090, data in /data on the volume): remove it from the values" $key) }}
{{- end }}
{{- end }}
{{- if hasKey $gateway "receipt_key" }}
{{- fail "config.gateway.receipt_key is a secret and would land in the ConfigMap: set secrets.receiptKey or existingSecret (key receipt-key) instead" }}
{{- end }}
{{- if hasKey $cosmos "key" }}
{{- fail "config.cosmos.key is a secret and would land in the ConfigMap: set secrets.cosmosKey or existingSecret (key cosmos-key) instead" }}
{{- end }}
{{- if hasKey $eventhubs "connection_string" }}
{{- fail "config.eventhubs.connection_string is a secret and would land in the ConfigMap: set secrets.eventhubsConnectionString or existingSecret (key eventhubs-connection-string) instead" }}
{{- end }}
{{- if hasKey $kafka "connection_string" }}
{{- fail "config.kafka.connection_string is a secret and would land in the ConfigMap: set secrets.kafkaConnectionString or existingSecret (key kafka-connection-string) instead" }}
{{- end }}
{{- if hasKey $kafka "sasl_password" }}
{{- fail "config.kafka.sasl_password is a secret and would land in the ConfigMap: set secrets.kafkaSaslPassword or existingSecret (key kafka-sasl-password) instead" }}
{{- end }}
{{- if hasKey $jwt "hs256_secret" }}
{{- fail "config.gateway.auth.jwt.hs256_secret is a secret and would land in the ConfigMap: set secrets.jwtHs256Secret or existingSecret (key jwt-hs256-secret) instead" }}
{{- end }}
{{- if hasKey $callbacks "secrets" }}
{{- fail "config.callbacks.secrets is a secret and would land in the ConfigMap: set secrets.callbackSecrets or existingSecret (key callback-secrets, the list as [\"whsec_…\"]) instead" }}
{{- end }}
{{- range $name, $apiKey := get $auth "api_keys" | default dict }}
{{- if and (kindIs "map" $apiKey) (hasKey $apiKey "key") }}
{{- fail (printf "config.gateway.auth.api_keys.%s.key is a secret and would land in the ConfigMap: set secrets.apiKeys.%s, or existingSecret (key api-key-%s) and existingSecretApiKeys, instead" $name $name $name) }}
{{- end }}
{{- end }}
{{- $secretsSet := false }}
{{- range $key, $value := .Values.secrets }}
{{- if $value }}{{ $secretsSet = true }}{{ end }}
{{- end }}
{{- if and .Values.existingSecret $secretsSet }}
{{- fail "set either existingSecret or secrets.*, not both: with existingSecret the chart creates no Secret" }}
{{- end }}
{{- if and .Values.existingSecretApiKeys (not .Values.existingSecret) }}
{{- fail "existingSecretApiKeys names keys of existingSecret, which is not set (use secrets.apiKeys for keys the chart keeps)" }}
{{- end }}
{{- if and .Values.workloadIdentity.enabled .Values.serviceAccount.create (not .Values.workloadIdentity.clientId) }}
{{- fail "workloadIdentity.enabled needs workloadIdentity.clientId (the managed identity's client id) for the ServiceAccount the chart creates" }}
{{- end }}
{{- if eq (include "skyport.shape" .) "split" }}
{{- if not (get $services "base_url") }}
{{- fail (printf "config.services.base_url must be set with profile %s: skyport-worker calls the five services there (only the all-in-one runs simulated ones)" $profile) }}
{{- end }}
{{- if or (eq (toString (get $stream "backend")) "embedded") (eq (toString (get $store "backend")) "embedded") }}
{{- fail (printf "profile %s runs the gateway and the worker in separate pods, which cannot share an embedded stream or store: unset config.stream.backend and config.store.backend (or use profile embedded)" $profile) }}
{{- end }}
{{- if and (eq $profile "kafka") (ne (toString (get $store "backend")) "cosmos") }}
{{- fail "profile kafka runs the gateway and the worker in separate pods, which share status through Cosmos DB: set config.store.backend = \"cosmos\" and config.cosmos" }}
{{- end }}
{{- if not (or .Values.existingSecret .Values.secrets.receiptKey) }}
{{- fail (printf "profile %s needs gateway.receipt_key, shared by every gateway: set secrets.receiptKey (at least 32 characters) or existingSecret (key receipt-key)" $profile) }}
{{- end }}
{{- if and (eq (toString (get $callbacks "enabled")) "true") (not (or .Values.existingSecret .Values.secrets.callbackSecrets)) }}
{{- fail (printf "config.callbacks.enabled = true with profile %s (status in Cosmos DB) needs a signing secret: set secrets.callbackSecrets ([\"whsec_…\"]) or existingSecret (key callback-secrets)" $profile) }}
{{- end }}
{{- $authOn := ternary (get $auth "enabled") true (hasKey $auth "enabled") }}
{{- if and $authOn (not (or .Values.secrets.apiKeys .Values.existingSecretApiKeys (hasKey $auth "jwt"))) }}
{{- fail (printf "profile %s turns gateway auth on: give API keys (secrets.apiKeys, or existingSecret with existingSecretApiKeys) or bearer tokens (config.gateway.auth.jwt), or set config.gateway.auth.enabled = false" $profile) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The pod template of a component: (dict "root" $ "component" "gateway" "key"
"gateway" "values" .Values.gateway "binary" "skyport-gateway" "port" 8080).
*/}}
{{- define "skyport.podTemplate" -}}
{{- $root := .root }}
{{- $values := .values }}
{{- $secretEntries := (include "skyport.secretEntries" $root | fromJson).entries -}}
metadata:
  labels:
    {{- include "skyport.labels" . | nindent 4 }}
    {{- if $root.Values.workloadIdentity.enabled }}
    azure.workload.identity/use: "true"
    {{- end }}
    {{- with $values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include "skyport.configToml" $root | sha256sum }}
    {{- if and $secretEntries (not $root.Values.existingSecret) }}
    checksum/secret: {{ include "skyport.secretData" $root | sha256sum }}
    {{- end }}
    {{- if $root.Values.metrics.podAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ .port | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with $values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "skyport.serviceAccountName" $root }}
  automountServiceAccountToken: {{ $root.Values.serviceAccount.automountToken }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  terminationGracePeriodSeconds: {{ include "skyport.terminationGracePeriod" . }}
  {{- with $values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .component }}
      image: {{ include "skyport.image" (dict "root" $root "image" $values.image) | quote }}
      imagePullPolicy: {{ $values.image.pullPolicy }}
      args: ["--config", "/etc/skyport/skyport.toml"]
      ports:
        - name: http
          containerPort: {{ .port }}
          protocol: TCP
      env:
        - name: RUST_LOG
          value: {{ $root.Values.logFilter | quote }}
        {{- if eq .component "worker" }}
        {{- if eq $values.kind "StatefulSet" }}
        # The pod's stable name is its Event Hubs owner id and its change-feed
        # instance name.
        - name: SKYPORT__EVENTHUBS__INSTANCE_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- if not (hasKey (get ($root.Values.config | default dict) "change_feed" | default dict) "instance_name") }}
        - name: SKYPORT__CHANGE_FEED__INSTANCE_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- end }}
        {{- end }}
        {{- end }}
        {{- range $secretEntries }}
        - name: {{ .env }}
          valueFrom:
            secretKeyRef:
              name: {{ include "skyport.secretName" $root }}
              key: {{ .key }}
              {{- if .optional }}
              optional: true
              {{- end }}
        {{- end }}
        {{- with $root.Values.otel }}
        {{- if .endpoint }}
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: OTEL_EXPORTER_OTLP_ENDPOINT
          value: {{ .endpoint | quote }}
        - name: OTEL_SERVICE_NAME
          value: {{ $.binary | quote }}
        {{- $attributes := list (printf "service.version=%s" $root.Chart.AppVersion) "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.name=$(POD_NAME)" }}
        {{- range $name, $value := .resourceAttributes }}
        {{- $attributes = append $attributes (printf "%s=%s" $name $value) }}
        {{- end }}
        - name: OTEL_RESOURCE_ATTRIBUTES
          value: {{ join "," $attributes | quote }}
        {{- with .sampler }}
        - name: OTEL_TRACES_SAMPLER
          value: {{ . | quote }}
        {{- end }}
        {{- with .samplerArg }}
        - name: OTEL_TRACES_SAMPLER_ARG
          value: {{ . | quote }}
        {{- end }}
        {{- end }}
        {{- end }}
        {{- with $values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      startupProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 2
        timeoutSeconds: 2
        failureThreshold: 60
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 10
        timeoutSeconds: 2
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
        periodSeconds: 5
        timeoutSeconds: 2
        failureThreshold: 2
      {{- if and (ne .component "worker") $values.preStopSleepSeconds }}
      lifecycle:
        preStop:
          sleep:
            seconds: {{ $values.preStopSleepSeconds }}
      {{- end }}
      {{- with $values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/skyport
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- if eq .component "all-in-one" }}
        - name: data
          mountPath: /data
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "skyport.fullname" $root }}
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
{{- end }}

{{/* The data of the Secret the chart creates (base64), also hashed into checksum/secret. */}}
{{- define "skyport.secretData" -}}
{{- range (include "skyport.secretEntries" . | fromJson).entries }}
{{ .key }}: {{ .value | b64enc }}
{{- end }}
{{- end }}
