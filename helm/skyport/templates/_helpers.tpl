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

{{/* The first host of the Ingress's TLS, when it is rendered with one; else nothing. */}}
{{- define "skyport.tlsHost" -}}
{{- if .Values.ingress.enabled }}
{{- $hosts := list }}
{{- range .Values.ingress.tls }}
{{- $hosts = concat $hosts (.hosts | default list) }}
{{- end }}
{{- with $hosts }}{{ first . }}{{ end }}
{{- end }}
{{- end }}

{{/*
Whether callbacks are on, as the rendered configuration says: config.callbacks.enabled when set, else
true when secrets.callbackSecrets are given ("true" or "").
*/}}
{{- define "skyport.callbacksOn" -}}
{{- $callbacks := get (.Values.config | default dict) "callbacks" | default dict }}
{{- if hasKey $callbacks "enabled" }}
{{- if eq (toString (get $callbacks "enabled")) "true" }}true{{ end }}
{{- else if .Values.secrets.callbackSecrets }}true{{ end }}
{{- end }}

{{/*
The configuration file of a role: (dict "root" $ "role" "gateway"), role gateway, worker or all-in-one.
.Values.config with the keys the chart owns: the API on 0.0.0.0:8080 and the probes and /metrics apart
on 0.0.0.0:9090 (gateway.internal_listen; the worker's worker.listen), the data directory on the
volume, authentication on unless auth.allowAnonymous; and, when unset, callbacks.enabled = true with
callback secrets given and gateway.public_url = https://FIRST-TLS-HOST. The worker's file has no
gateway.auth (it serves no API, and gets no API key or token secret): authentication off there, so
that its configuration check does not ask for the credentials it never uses. As TOML: Helm reads
numbers in values as floats, so toToml writes 30000 as 30000.0, which an integer key refuses: whole
numbers are written back as integers (a float key takes an integer as well).
*/}}
{{- define "skyport.configToml" -}}
{{- $root := .root }}
{{- $config := deepCopy ($root.Values.config | default dict) }}
{{- $gateway := get $config "gateway" | default dict }}
{{- $_ := set $gateway "listen" "0.0.0.0:8080" }}
{{- $_ := set $gateway "internal_listen" "0.0.0.0:9090" }}
{{- if eq .role "worker" }}
{{- $_ := set $gateway "auth" (dict "enabled" false) }}
{{- else }}
{{- $auth := get $gateway "auth" | default dict }}
{{- $_ := set $auth "enabled" (not $root.Values.auth.allowAnonymous) }}
{{- $_ := set $gateway "auth" $auth }}
{{- end }}
{{- $tlsHost := include "skyport.tlsHost" $root }}
{{- if and $tlsHost (not (hasKey $gateway "public_url")) }}
{{- $_ := set $gateway "public_url" (printf "https://%s" $tlsHost) }}
{{- end }}
{{- $_ := set $config "gateway" $gateway }}
{{- $callbacks := get $config "callbacks" | default dict }}
{{- if and $root.Values.secrets.callbackSecrets (not (hasKey $callbacks "enabled")) }}
{{- $_ := set $callbacks "enabled" true }}
{{- $_ := set $config "callbacks" $callbacks }}
{{- end }}
{{- if eq (include "skyport.shape" $root) "split" }}
{{- $worker := get $config "worker" | default dict }}
{{- $_ := set $worker "listen" "0.0.0.0:9090" }}
{{- $_ := set $config "worker" $worker }}
{{- else }}
{{- $embedded := get $config "embedded" | default dict }}
{{- $_ := set $embedded "data_dir" "/data" }}
{{- $_ := set $config "embedded" $embedded }}
{{- end }}
{{- $toml := regexReplaceAll `(?m)= (-?[0-9]+)\.0$` (toToml $config) "= ${1}" }}
{{- $file := ternary "worker.toml" "skyport.toml" (eq .role "worker") }}
{{- $whose := ternary "; without gateway.auth\n# (the worker serves no API, and holds no API key or token secret)" "" (eq .role "worker") }}
{{- printf "# %s, rendered by the %s chart from .Values.config%s.\n%s\n" $file (include "skyport.chart" $root) $whose (trim $toml) }}
{{- end }}

{{/* The ConfigMap's key a role's container reads its configuration from. */}}
{{- define "skyport.configFile" -}}
{{- ternary "worker.toml" "skyport.toml" (eq . "worker") }}
{{- end }}

{{/*
The secret values and where they go, as JSON {"entries": [{key, env, value, optional}]}, for
(dict "root" $ "role" ROLE): ROLE gateway, worker or all-in-one gets only the entries its role uses
(the gateway the receipt keys, API keys, the JWT secret, the stream's credentials and the Cosmos DB
key; the worker the stream's credentials, the Cosmos DB key and the callback secrets; the
all-in-one all), and ROLE "secret" every entry
(the Secret's data). With existingSecret every key a role may use (optional but for the receipt
keys with profile azure or kafka, the callback secrets, read there only when callbacks are on, and
the listed API keys), else the values set in `secrets`. The lists (the receipt keys, the callback
secrets) are one value each, the list in brackets with each item quoted (["whsec_…", "whsec_…"]):
the form the binaries read a list from one variable in.
*/}}
{{- define "skyport.secretEntries" -}}
{{- $root := .root }}
{{- $role := .role }}
{{- $gateway := list "gateway" "all-in-one" }}
{{- $worker := list "worker" "all-in-one" }}
{{- $both := list "gateway" "worker" "all-in-one" }}
{{- $known := list
  (list "receiptKeys" "receipt-keys" "SKYPORT__GATEWAY__RECEIPT_KEYS" $gateway)
  (list "cosmosKey" "cosmos-key" "SKYPORT__COSMOS__KEY" $both)
  (list "eventhubsConnectionString" "eventhubs-connection-string" "SKYPORT__EVENTHUBS__CONNECTION_STRING" $both)
  (list "kafkaConnectionString" "kafka-connection-string" "SKYPORT__KAFKA__CONNECTION_STRING" $both)
  (list "kafkaSaslPassword" "kafka-sasl-password" "SKYPORT__KAFKA__SASL_PASSWORD" $both)
  (list "jwtHs256Secret" "jwt-hs256-secret" "SKYPORT__GATEWAY__AUTH__JWT__HS256_SECRET" $gateway)
  (list "callbackSecrets" "callback-secrets" "SKYPORT__CALLBACKS__SECRETS" $worker) }}
{{- $split := eq (include "skyport.shape" $root) "split" }}
{{- $callbacksOn := eq (include "skyport.callbacksOn" $root) "true" }}
{{- $kafkaEntra := eq (include "skyport.kafkaEntra" $root) "true" }}
{{- $entries := list }}
{{- range $known }}
{{- $key := index . 1 }}
{{- $env := index . 2 }}
{{- if or (eq $role "secret") (has $role (index . 3)) }}
{{- if $root.Values.existingSecret }}
{{- $required := and $split (eq $key "receipt-keys") }}
{{- $read := true }}
{{- if and $split (eq $key "callback-secrets") }}
{{- $required = $callbacksOn }}
{{- $read = $callbacksOn }}
{{- end }}
{{- if and $kafkaEntra (has $key (list "kafka-connection-string" "kafka-sasl-password")) }}
{{- $read = false }}
{{- end }}
{{- if $read }}
{{- $entries = append $entries (dict "key" $key "env" $env "value" "" "optional" (not $required)) }}
{{- end }}
{{- else }}
{{- with get $root.Values.secrets (index . 0) }}
{{- $entries = append $entries (dict "key" $key "env" $env "value" (ternary (toJson .) . (kindIs "slice" .)) "optional" false) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if or (eq $role "secret") (has $role $gateway) }}
{{- if $root.Values.existingSecret }}
{{- range $root.Values.existingSecretApiKeys }}
{{- $entries = append $entries (dict "key" (printf "api-key-%s" .) "env" (printf "SKYPORT__GATEWAY__AUTH__API_KEYS__%s__KEY" (upper .)) "value" "" "optional" false) }}
{{- end }}
{{- else }}
{{- range $name, $key := $root.Values.secrets.apiKeys }}
{{- $entries = append $entries (dict "key" (printf "api-key-%s" $name) "env" (printf "SKYPORT__GATEWAY__AUTH__API_KEYS__%s__KEY" (upper $name)) "value" $key "optional" false) }}
{{- end }}
{{- end }}
{{- end }}
{{- dict "entries" $entries | toJson }}
{{- end }}

{{/*
A number the binaries read from config, as the chart renders it: the value
under config.SECTION.KEY, else the binaries' default for it (the one list
of those defaults the templates need). (dict "root" $ "key"
"worker.checkpoint_interval_ms").
*/}}
{{- define "skyport.configNumber" -}}
{{- $defaults := dict "gateway.shutdown_grace_period_ms" 10000 "worker.shutdown_grace_period_ms" 30000 "worker.checkpoint_interval_ms" 5000 "store.status_retention_s" 604800 "store.dead_letter_retention_s" 2592000 }}
{{- if not (hasKey $defaults .key) }}
{{- fail (printf "skyport.configNumber: no default for %s" .key) }}
{{- end }}
{{- $path := splitList "." .key }}
{{- $section := get (.root.Values.config | default dict) (index $path 0) | default dict }}
{{- ternary (get $section (index $path 1)) (get $defaults .key) (hasKey $section (index $path 1)) | int64 }}
{{- end }}

{{/*
terminationGracePeriodSeconds of a component: (dict "root" $ "component"
"gateway" "key" "gateway" "values" .Values.gateway), key naming its values.
It must be longer than what the process may take once the pod is told to
stop: the preStop sleep, then its shutdown grace period(s) after SIGTERM (the
all-in-one's gateway and worker drain in turn at worst). Unset: that plus 15 s.
*/}}
{{- define "skyport.terminationGracePeriod" -}}
{{- $gatewayGrace := include "skyport.configNumber" (dict "root" .root "key" "gateway.shutdown_grace_period_ms") | int64 }}
{{- $workerGrace := include "skyport.configNumber" (dict "root" .root "key" "worker.shutdown_grace_period_ms") | int64 }}
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

{{/* "true" when Kafka authenticates with Entra (config.kafka.auth: entra): no Kafka secret is read. */}}
{{- define "skyport.kafkaEntra" -}}
{{- $kafka := get (.Values.config | default dict) "kafka" | default dict }}
{{- eq (toString (get $kafka "auth")) "entra" }}
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
{{- if hasKey .Values.secrets "receiptKey" }}
{{- fail "secrets.receiptKey is no longer read: the receipt keys are a list now, newest first (the first signs, every one verifies); move the key into secrets.receiptKeys, e.g. secrets.receiptKeys: [\"<the key>\"] (an existingSecret's receipt-key becomes receipt-keys, holding [\"<the key>\"])" }}
{{- end }}
{{- range $key, $section := dict "config.gateway.listen" $gateway "config.gateway.internal_listen" $gateway "config.worker.listen" $worker "config.embedded.data_dir" $embedded }}
{{- if hasKey $section (last (splitList "." $key)) }}
{{- fail (printf "%s is set by the chart (the API on 0.0.0.0:8080, the probes and /metrics on 0.0.0.0:9090 for the gateway, the all-in-one and the worker, data in /data on the volume): remove it from the values" $key) }}
{{- end }}
{{- end }}
{{- if hasKey $auth "enabled" }}
{{- fail "config.gateway.auth.enabled is set by the chart: authentication is on unless auth.allowAnonymous is true (refused with an Ingress, a LoadBalancer or a NodePort); remove it from config" }}
{{- end }}
{{- if hasKey $gateway "receipt_key" }}
{{- fail "config.gateway.receipt_key is no longer read, and a secret that would land in the ConfigMap: set secrets.receiptKeys (a list, newest first) or existingSecret (key receipt-keys) instead" }}
{{- end }}
{{- if hasKey $gateway "receipt_keys" }}
{{- fail "config.gateway.receipt_keys is a secret and would land in the ConfigMap: set secrets.receiptKeys or existingSecret (key receipt-keys, the list as [\"…\"]) instead" }}
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
{{- if and (eq (include "skyport.kafkaEntra" .) "true") (or .Values.secrets.kafkaConnectionString .Values.secrets.kafkaSaslPassword) }}
{{- fail "config.kafka.auth = entra authenticates to Kafka with workload identity, so secrets.kafkaConnectionString and secrets.kafkaSaslPassword would be ignored: remove them" }}
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
{{- $credentials := or .Values.secrets.apiKeys .Values.existingSecretApiKeys (hasKey $auth "jwt") }}
{{- if .Values.auth.allowAnonymous }}
{{- if .Values.ingress.enabled }}
{{- fail "auth.allowAnonymous serves the API to anyone, and ingress.enabled would put it outside the cluster: turn one of them off (give a credential instead: secrets.apiKeys, existingSecretApiKeys or config.gateway.auth.jwt)" }}
{{- end }}
{{- if has .Values.service.type (list "LoadBalancer" "NodePort") }}
{{- fail (printf "auth.allowAnonymous serves the API to anyone, and service.type %s would put it outside the cluster: use service.type ClusterIP, or turn auth.allowAnonymous off and give a credential (secrets.apiKeys, existingSecretApiKeys or config.gateway.auth.jwt)" .Values.service.type) }}
{{- end }}
{{- if $credentials }}
{{- fail "auth.allowAnonymous turns authentication off, so the credentials given (secrets.apiKeys, existingSecretApiKeys or config.gateway.auth.jwt) would be ignored: remove them, or turn auth.allowAnonymous off" }}
{{- end }}
{{- else if not $credentials }}
{{- fail "authentication is on: give API keys (secrets.apiKeys, or existingSecret with existingSecretApiKeys) or bearer tokens (config.gateway.auth.jwt); or, for an install that only the cluster reaches, set auth.allowAnonymous: true" }}
{{- end }}
{{- if and .Values.networkPolicy.enabled (not .Values.networkPolicy.ingressFrom) }}
{{- fail "networkPolicy.enabled with networkPolicy.ingressFrom empty would let nothing reach the API port: list the ingress controller's pods (or [{namespaceSelector: {}}] for every pod of the cluster)" }}
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
{{- if not (or .Values.existingSecret .Values.secrets.receiptKeys) }}
{{- fail (printf "profile %s needs gateway.receipt_keys, shared by every gateway: set secrets.receiptKeys (a list, each key at least 32 characters) or existingSecret (key receipt-keys)" $profile) }}
{{- end }}
{{- if and (eq (toString (get $callbacks "enabled")) "true") (not (or .Values.existingSecret .Values.secrets.callbackSecrets)) }}
{{- fail (printf "config.callbacks.enabled = true with profile %s (status in Cosmos DB) needs a signing secret: set secrets.callbackSecrets ([\"whsec_…\"]) or existingSecret (key callback-secrets)" $profile) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The pod template of a component: (dict "root" $ "component" "gateway" "key"
"gateway" "values" .Values.gateway "binary" "skyport-gateway"), component
gateway, worker or all-in-one. Every container serves its probes and
/metrics on the internal port 9090 (the worker's admin reports too); the
gateway and the all-in-one serve the API on 8080, apart, so that an
exhausted API cannot starve the probes.
*/}}
{{- define "skyport.podTemplate" -}}
{{- $root := .root }}
{{- $values := .values }}
{{- $role := dict "root" $root "role" .component }}
{{- $secretEntries := (include "skyport.secretEntries" $role | fromJson).entries -}}
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
    checksum/config: {{ include "skyport.configToml" $role | sha256sum }}
    {{- if and $secretEntries (not $root.Values.existingSecret) }}
    checksum/secret: {{ include "skyport.secretData" $role | sha256sum }}
    {{- end }}
    {{- if and $root.Values.metrics.podAnnotations (eq $root.Values.metrics.monitor.kind "none") }}
    prometheus.io/scrape: "true"
    prometheus.io/port: "9090"
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
      args: ["--config", "/etc/skyport/{{ include "skyport.configFile" .component }}"]
      ports:
        {{- if ne .component "worker" }}
        - name: http
          containerPort: 8080
          protocol: TCP
        {{- end }}
        - name: internal
          containerPort: 9090
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
        - name: OTEL_EXPORTER_OTLP_PROTOCOL
          value: {{ .protocol | quote }}
        {{- if .metrics }}
        - name: OTEL_METRICS_EXPORTER
          value: otlp
        {{- end }}
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
          port: internal
        periodSeconds: 2
        timeoutSeconds: 2
        failureThreshold: 60
      livenessProbe:
        httpGet:
          path: /healthz
          port: internal
        periodSeconds: 10
        timeoutSeconds: 2
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: internal
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

{{/*
The data (base64) of the Secret the chart creates, for (dict "root" $ "role" "secret"), and of what
one role reads of it, hashed into that role's checksum/secret: a changed secret rolls only the pods
that read it.
*/}}
{{- define "skyport.secretData" -}}
{{- range (include "skyport.secretEntries" . | fromJson).entries }}
{{ .key }}: {{ .value | b64enc }}
{{- end }}
{{- end }}
