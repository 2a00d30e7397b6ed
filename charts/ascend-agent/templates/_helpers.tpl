{{/* Labels on every object; the selector uses the name label alone, as examples/daemonset.yaml does. */}}
{{- define "ascend-agent.labels" -}}
app.kubernetes.io/name: ascend-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "ascend-agent.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The port of config.metricsAddress (HOST:PORT), empty when the endpoint is off. */}}
{{- define "ascend-agent.metricsPort" -}}
{{- with .Values.config.metricsAddress }}{{ splitList ":" . | last }}{{ end }}
{{- end }}

{{/* The agent's own directory (its instance lock): pluginDir, else beside kubeletDir. */}}
{{- define "ascend-agent.agentDir" -}}
{{- .Values.config.pluginDir | default (printf "%s/plugins/ascend-agent" (dir .Values.config.kubeletDir)) }}
{{- end }}

{{/* The config file: .Values.config, with the keys of the features switched by top-level values. Keys at
     the agent's default are left out, so that the default file loads in agents that predate them. */}}
{{- define "ascend-agent.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if not .Values.cluster.enabled }}
{{- $_ := set $config "cluster" false }}
{{- end }}
{{- with .Values.cluster.podResourcesSocket }}
{{- $_ := set $config "podResourcesSocket" . }}
{{- end }}
{{- if not .Values.deviceInfo.enabled }}
{{- $_ := set $config "deviceInfo" false }}
{{- end }}
{{- if .Values.volcano.enabled }}
{{- $_ := set $config "volcano" true }}
{{- $_ := set $config "volcanoSchedulerName" .Values.volcano.schedulerName }}
{{- end }}
{{- if .Values.dra.enabled }}
{{- $_ := set $config "kubeletApi" "dra" }}
{{- $_ := set $config "draDriverName" .Values.dra.driverName }}
{{- $_ := set $config "draTaintEffect" .Values.dra.taintEffect }}
{{- $_ := set $config "draCleanup" .Values.dra.cleanup }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/* Combinations that cannot work, refused with one line each (values.schema.json checks each value). */}}
{{- define "ascend-agent.validate" -}}
{{- if and (not .Values.cluster.enabled) .Values.volcano.enabled }}
{{- fail "volcano.enabled needs cluster.enabled: Volcano's choice of chips is read from the API server" }}
{{- end }}
{{- if and (not .Values.cluster.enabled) .Values.dra.enabled }}
{{- fail "dra.enabled needs cluster.enabled: ResourceSlices and ResourceClaims live in the API server" }}
{{- end }}
{{- with .Values.flowControl.queuing }}
{{- if gt (int .handSize) (int .queues) }}
{{- fail "flowControl.queuing.handSize must not be greater than flowControl.queuing.queues" }}
{{- end }}
{{- end }}
{{- end }}
