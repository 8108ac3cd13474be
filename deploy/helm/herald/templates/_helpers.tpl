{{- define "herald.name" -}}herald{{- end -}}

{{- define "herald.fullname" -}}
{{- if contains "herald" .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-herald" .Release.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "herald.labels" -}}
app.kubernetes.io/name: herald
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "herald.selector" -}}
app.kubernetes.io/name: herald
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The collector's pods: not herald's selector, so that Herald's Services never pick them. */}}
{{- define "herald.collectorSelector" -}}
app.kubernetes.io/name: herald-otel-collector
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "herald.collectorLabels" -}}
{{ include "herald.collectorSelector" . }}
app.kubernetes.io/part-of: herald
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "herald.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{- define "herald.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "herald.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{/* herald.toml: the values' config with the secret files' paths set. */}}
{{- define "herald.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $db := default (dict) $cfg.database -}}
{{- $_ := set $db "password_file" "/var/run/secrets/herald/database/password" -}}
{{- $_ := set $db "owner_password_file" "/var/run/secrets/herald/database-owner/password" -}}
{{- $_ := set $cfg "database" $db -}}
{{- $admin := default (dict) $cfg.admin -}}
{{- $_ := set $admin "token_file" "/var/run/secrets/herald/admin/token" -}}
{{- if .Values.secrets.adminReadToken.name -}}
{{- $_ := set $admin "read_token_file" "/var/run/secrets/herald/admin-read/token" -}}
{{- end -}}
{{- $_ := set $cfg "admin" $admin -}}
{{- $sup := default (dict) $cfg.suppression -}}
{{- $_ := set $sup "key_file" "/var/run/secrets/herald/suppression/key" -}}
{{- $_ := set $cfg "suppression" $sup -}}
{{- if .Values.secrets.httpIngestToken.name -}}
{{- $hi := default (dict) $cfg.http_ingest -}}
{{- $_ := set $hi "token_file" "/var/run/secrets/herald/http-ingest/token" -}}
{{- $_ := set $cfg "http_ingest" $hi -}}
{{- end -}}
{{- /* Spans go to the collector beside Herald when it is deployed, unless set. */ -}}
{{- if .Values.otelCollector.enabled -}}
{{- $tel := default (dict) $cfg.telemetry -}}
{{- if not $tel.traces_endpoint -}}
{{- $_ := set $tel "traces_endpoint" (printf "http://%s-otel-collector:4318/v1/traces" (include "herald.fullname" .)) -}}
{{- end -}}
{{- $_ := set $cfg "telemetry" $tel -}}
{{- end -}}
{{- /* Retention needs the schema owner: the CronJob runs it, never the role groups. */ -}}
{{- $ret := default (dict) $cfg.retention -}}
{{- $_ := set $ret "interval_secs" 0 -}}
{{- $_ := set $cfg "retention" $ret -}}
{{- $kafka := default (dict) $cfg.kafka -}}
{{- /* The Kafka password and TLS files come from Secrets mounted as files. */ -}}
{{- if .Values.secrets.kafkaPassword.name -}}
{{- $sasl := default (dict) $kafka.sasl -}}
{{- $_ := set $sasl "password_file" "/var/run/secrets/herald/kafka/password" -}}
{{- $_ := set $kafka "sasl" $sasl -}}
{{- end -}}
{{- if .Values.secrets.kafkaTls.name -}}
{{- $tls := default (dict) $kafka.tls -}}
{{- $dir := "/var/run/secrets/herald/kafka-tls" -}}
{{- with .Values.secrets.kafkaTls.caKey }}{{ $_ := set $tls "ca_file" (printf "%s/%s" $dir .) }}{{ end -}}
{{- with .Values.secrets.kafkaTls.certKey }}{{ $_ := set $tls "cert_file" (printf "%s/%s" $dir .) }}{{ end -}}
{{- with .Values.secrets.kafkaTls.keyKey }}{{ $_ := set $tls "key_file" (printf "%s/%s" $dir .) }}{{ end -}}
{{- $_ := set $kafka "tls" $tls -}}
{{- end -}}
{{- $parts := default (dict) $kafka.partitions -}}
{{- $_ := set $parts "order_events" (index .Values.partitions "order-events") -}}
{{- $_ := set $parts "deliveries" (index .Values.partitions "herald.deliveries") -}}
{{- $_ := set $kafka "partitions" $parts -}}
{{- $_ := set $cfg "kafka" $kafka -}}
{{- /* YAML numbers reach templates as floats, and toToml writes 16 as 16.0, which
     Herald's integer settings refuse: whole numbers are written as integers. */ -}}
{{- regexReplaceAll "(?m)= (-?[0-9]+)\\.0$" (toToml $cfg) "= ${1}" -}}
{{- end -}}

{{- define "herald.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* The port of a listen address, host:port as Herald takes it ("0.0.0.0:9465", "[::]:9465"). */}}
{{- define "herald.listenPort" -}}
{{- splitList ":" . | last | int -}}
{{- end -}}

{{/* "true" when a listen address is on loopback (127.0.0.0/8, ::1), empty otherwise: only
     the pod itself (and kubectl port-forward) reaches it, and no NetworkPolicy applies. */}}
{{- define "herald.loopback" -}}
{{- $host := regexReplaceAll ":[0-9]+$" . "" | trimPrefix "[" | trimSuffix "]" -}}
{{- if or (hasPrefix "127." $host) (eq $host "::1") -}}true{{- end -}}
{{- end -}}

{{/* The probe listener's port (config.admin.probe_listen, required: the probes use it). */}}
{{- define "herald.probePort" -}}
{{- $listen := required "config.admin.probe_listen must be set: the probes and the ServiceMonitor use it" .Values.config.admin.probe_listen -}}
{{- include "herald.listenPort" $listen -}}
{{- end -}}

{{/* The ports Herald connects to, for the NetworkPolicy's egress: a JSON list of whole
     numbers, each once. Takes dict "targets" (a list of host[:port] addresses, comma-
     separated lists of them as kafka.brokers is, or URLs such as
     postgres://user@db-a:5432,db-b:5432/herald?... and https://host/v1/traces) and
     "default", the port of an address that names none (443 in https:// URLs, 80 in
     http://). No target, or none set: [default]. */}}
{{- define "herald.targetPorts" -}}
{{- $ports := list -}}
{{- range $t := .targets -}}
{{- $t = trim (toString (default "" $t)) -}}
{{- if $t -}}
{{- $default := int $.default -}}
{{- if hasPrefix "https://" $t }}{{ $default = 443 }}{{ else if hasPrefix "http://" $t }}{{ $default = 80 }}{{ end -}}
{{- $rest := regexReplaceAll "^[A-Za-z][A-Za-z0-9+.-]*://" $t "" -}}
{{- $authority := regexReplaceAll "^.*@" (regexReplaceAll "[/?#].*$" $rest "") "" -}}
{{- range $a := splitList "," $authority -}}
{{- $a = trim $a -}}
{{- if $a -}}
{{- $p := splitList ":" $a | last -}}
{{- if and (contains ":" $a) (regexMatch "^[0-9]+$" $p) }}{{ $ports = append $ports (int $p) }}{{ else }}{{ $ports = append $ports $default }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (default (list (int .default)) (uniq $ports)) -}}
{{- end -}}
