{{/*
The alert rules of the release, as the `groups:` list of a Prometheus rules file: what
prometheusrule.yaml puts under a PrometheusRule's spec, and what docs/monitoring/ holds for
namespace skyport (its rules file and its Azure template are made from this rendering: see
docs/monitoring/README.md). Each objective is a value of alerts.*; the checkpoint's and the
retention's limits come from the configuration the chart renders (config.worker.checkpoint_interval_ms,
config.store.*_retention_s, the binaries' defaults when unset), so changing them moves the alerts.
Every selector names the release's namespace, and `up` the release's pods too, so two releases
alert apart. The PromQL is what Prometheus 2.42 evaluates. The annotations are Prometheus templates:
they are raw strings here, so that Helm leaves their {{ }} alone.
*/}}
{{- define "skyport.alertGroups" -}}
{{- $alerts := .Values.alerts }}
{{- $namespace := .Release.Namespace }}
{{- $in := printf "namespace=%q" $namespace }}
{{- $checkpointMs := include "skyport.configNumber" (dict "root" . "key" "worker.checkpoint_interval_ms") | int64 }}
{{- $checkpointLimit := divf (mul $checkpointMs $alerts.checkpointIntervals) 1000 }}
{{- $statusRetention := include "skyport.configNumber" (dict "root" . "key" "store.status_retention_s") | int64 }}
{{- $deadLetterRetention := include "skyport.configNumber" (dict "root" . "key" "store.dead_letter_retention_s") | int64 }}
{{- $slack := $alerts.retentionSlackSeconds | int64 }}
{{- $pods := printf "%s-(gateway-.+|worker-.+|[0-9]+)" (include "skyport.fullname" .) }}
{{- $post := printf `%s,route="/api/deliveryrequests",method="POST"` $in }}
{{- $runbook := $alerts.runbookBaseUrl -}}
- name: skyport
  rules:
    - alert: SkyportAcceptErrors
      expr: |-
        sum by (namespace) (rate(skyport_http_requests_total{ {{- $post }},status=~"5.."}[5m]) or rate(skyport_batch_refused_total{ {{- $in }},class="5xx"}[5m]))
          / sum by (namespace) (rate(skyport_http_requests_total{ {{- $post }}}[5m]) or rate(skyport_deliveries_accepted_total{ {{- $in }},via="batch"}[5m]) or rate(skyport_batch_refused_total{ {{- $in }}}[5m]))
          > {{ $alerts.errorRatio }}
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: {{ `Skyport answers too many requests with a 5xx in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `{{ $value | humanizePercentage }} of the delivery requests in namespace {{ $labels.namespace }} (each POST /api/deliveryrequests, and each request of a batch) were answered with a 5xx over the last 5 minutes, above the objective of %v %%.` (mulf $alerts.errorRatio 100) | toJson }}
        runbook_url: {{ printf "%s#skyportaccepterrors" $runbook | toJson }}
    - alert: SkyportAcceptSlow
      expr: |-
        histogram_quantile(0.99, sum by (namespace, le) (rate(skyport_http_request_duration_seconds_bucket{ {{- $post }},class="2xx"}[5m])))
          > {{ $alerts.latencyP99Seconds }}
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: {{ `Skyport's 202s are slower than their objective in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `The p99 of the 202s to POST /api/deliveryrequests in namespace {{ $labels.namespace }} was {{ $value | humanizeDuration }} over the last 5 minutes, above the objective of %v s. Held status reads (class held) are not counted. The buckets double from 0.5 ms (16 ms, 32 ms, …), so the quantile is interpolated inside its bucket: the true p99 lies somewhere in that bucket.` $alerts.latencyP99Seconds | toJson }}
        runbook_url: {{ printf "%s#skyportacceptslow" $runbook | toJson }}
    - alert: SkyportBacklogOld
      expr: |-
        max by (namespace, lane, partition) (skyport_consumer_oldest_event_age_seconds{ {{- $in }}})
          > {{ $alerts.backlogAgeSeconds }}
      for: 2m
      labels:
        severity: critical
      annotations:
        summary: {{ `Skyport holds an event older than its drain goal in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `The oldest unfinished event of partition {{ $labels.partition }} ({{ $labels.lane }} lane) in namespace {{ $labels.namespace }} was accepted {{ $value | humanizeDuration }} ago, longer than the drain goal of %v s.` $alerts.backlogAgeSeconds | toJson }}
        runbook_url: {{ printf "%s#skyportbacklogold" $runbook | toJson }}
    - alert: SkyportCheckpointStale
      expr: |-
        skyport_checkpoint_age_seconds{ {{- $in }}} > {{ $checkpointLimit }}
          and on (namespace, pod, lane, partition)
          (skyport_events_in_flight{ {{- $in }}} > 0 or skyport_consumer_lag_events{ {{- $in }}} > 0)
      for: 1m
      labels:
        severity: warning
      annotations:
        summary: {{ `A Skyport partition has stopped checkpointing in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `Partition {{ $labels.partition }} ({{ $labels.lane }} lane) on pod {{ $labels.pod }} in namespace {{ $labels.namespace }} last checkpointed {{ $value | humanizeDuration }} ago, more than %v checkpoint intervals (%v s), with events still to finish.` $alerts.checkpointIntervals $checkpointLimit | toJson }}
        runbook_url: {{ printf "%s#skyportcheckpointstale" $runbook | toJson }}
    - alert: SkyportCircuitOpen
      expr: |-
        min_over_time(skyport_breaker_state{ {{- $in }}}[{{ $alerts.breakerOpenMinutes }}m]) >= 1
      labels:
        severity: critical
      annotations:
        summary: {{ `A Skyport circuit breaker has stayed open in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `The circuit of step {{ $labels.step }} on pod {{ $labels.pod }} in namespace {{ $labels.namespace }} has not closed for %v minutes: open (2), its probes failing (1 while one runs). The pod's partitions have stopped pulling.` $alerts.breakerOpenMinutes | toJson }}
        runbook_url: {{ printf "%s#skyportcircuitopen" $runbook | toJson }}
    - alert: SkyportThrottled
      expr: |-
        sum by (namespace, dependency) (rate(skyport_throttled_total{ {{- $in }}}[5m]))
          > {{ $alerts.throttledPerSecond }}
      for: 15m
      labels:
        severity: warning
      annotations:
        summary: {{ `Skyport is throttled by {{ $labels.dependency }} in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `{{ $labels.dependency }} has answered {{ $value | humanize }} 429s a second to Skyport in namespace {{ $labels.namespace }} for 15 minutes, above the objective of %v a second.` $alerts.throttledPerSecond | toJson }}
        runbook_url: {{ printf "%s#skyportthrottled" $runbook | toJson }}
    - alert: SkyportCallbacksDeadLettered
      expr: |-
        sum by (namespace) (increase(skyport_callbacks_total{ {{- $in }},outcome="dead_lettered"}[15m]))
          > {{ $alerts.callbackDeadLetters }}
      labels:
        severity: warning
      annotations:
        summary: {{ `Skyport is dead-lettering callbacks in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `{{ $value | humanize }} callbacks ran out of retries and were dead-lettered in namespace {{ $labels.namespace }} over the last 15 minutes, more than the %v allowed.` $alerts.callbackDeadLetters | toJson }}
        runbook_url: {{ printf "%s#skyportcallbacksdeadlettered" $runbook | toJson }}
    - alert: SkyportRetentionBehind
      expr: |-
        skyport_retention_oldest_seconds{ {{- $in }},kind="status"} > {{ add $statusRetention $slack }}
          or skyport_retention_oldest_seconds{ {{- $in }},kind=~"dead_letter|callback_dead_letter"} > {{ add $deadLetterRetention $slack }}
      for: 15m
      labels:
        severity: warning
      annotations:
        summary: {{ `Skyport's retention sweeper is behind in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `The oldest {{ $labels.kind }} entry kept by pod {{ $labels.pod }} in namespace {{ $labels.namespace }} is {{ $value | humanizeDuration }} old, past its retention window plus %d s (store.status_retention_s = %d s for status, store.dead_letter_retention_s = %d s for dead letters).` $slack $statusRetention $deadLetterRetention | toJson }}
        runbook_url: {{ printf "%s#skyportretentionbehind" $runbook | toJson }}
    - alert: SkyportTimersLate
      expr: |-
        histogram_quantile(0.99, sum by (namespace, le) (rate(skyport_timer_lateness_seconds_bucket{ {{- $in }}}[5m])))
          > {{ $alerts.timerLatenessSeconds }}
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: {{ `Skyport starts Waiting deliveries late in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `The p99 of how late the timers of Waiting deliveries fired in namespace {{ $labels.namespace }} was {{ $value | humanizeDuration }} over the last 5 minutes, above the objective of %v s: deliveries book later than worker.booking_lead_s before their pickup.` $alerts.timerLatenessSeconds | toJson }}
        runbook_url: {{ printf "%s#skyporttimerslate" $runbook | toJson }}
    - alert: SkyportProcessDown
      expr: |-
        up{ {{- $in }},pod=~"{{ $pods }}"} == 0
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: {{ `A Skyport pod cannot be scraped in {{ $labels.namespace }}` | toJson }}
        description: {{ `Pod {{ $labels.pod }} in namespace {{ $labels.namespace }} has not answered its /metrics scrape for 5 minutes.` | toJson }}
        runbook_url: {{ printf "%s#skyportprocessdown" $runbook | toJson }}
    - alert: SkyportDown
      expr: |-
        sum by (namespace) (up{ {{- $in }},pod=~"{{ $pods }}"}) == 0
          or absent(up{ {{- $in }},pod=~"{{ $pods }}"})
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: {{ `No Skyport pod is up in {{ $labels.namespace }}` | toJson }}
        description: {{ printf `No pod of the release %s in namespace {{ $labels.namespace }} has answered a /metrics scrape for 5 minutes, or none is scraped at all.` (include "skyport.fullname" .) | toJson }}
        runbook_url: {{ printf "%s#skyportdown" $runbook | toJson }}
{{- end }}
