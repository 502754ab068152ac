{{/* The chart's name, or nameOverride. */}}
{{- define "xdpq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release's name when it
already holds the chart's name, else <release>-<chart>. At most 63
characters (a DNS label).
*/}}
{{- define "xdpq.fullname" -}}
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

{{/* The labels that select the daemon's pods: they never change. */}}
{{- define "xdpq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "xdpq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "xdpq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "xdpq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: xdpq
{{- end }}

{{/* The service account's name. */}}
{{- define "xdpq.serviceAccountName" -}}
{{- default (include "xdpq.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The image: repository:tag, tag defaulting to the chart's appVersion; or repository@digest. */}}
{{- define "xdpq.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Whether the cluster serves ServiceMonitors (the Prometheus operator's CRD). */}}
{{- define "xdpq.hasServiceMonitor" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor" }}true{{ end }}
{{- end }}

{{/* Whether the cluster serves NetworkAttachmentDefinitions (Multus's CRD). */}}
{{- define "xdpq.hasNAD" -}}
{{- if .Capabilities.APIVersions.Has "k8s.cni.cncf.io/v1/NetworkAttachmentDefinition" }}true{{ end }}
{{- end }}

{{/*
The security context of the containers that install and remove the CNI
plugin: root (the CNI bin directory is root's), no capability, nothing
else writable.
*/}}
{{- define "xdpq.cniInstallSecurityContext" -}}
privileged: false
runAsUser: 0
runAsNonRoot: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The API server's address for the daemon and the sidecar when
apiServer.host is set: it overrides the kubernetes Service's that kubelet
puts in every container's environment.
*/}}
{{- define "xdpq.apiServerEnv" -}}
{{- if or .Values.apiServer.host .Values.apiServer.port }}
{{- if not (and .Values.apiServer.host .Values.apiServer.port) }}
{{- fail "apiServer: set both host and port, or neither" }}
{{- end }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | quote }}
{{- end }}
{{- end }}

{{/*
Whether the daemon is also the DRA driver xdpq.io: dra.enabled true, or
auto where the API server serves resource.k8s.io/v1 (Kubernetes 1.34+).
*/}}
{{- define "xdpq.draEnabled" -}}
{{- $on := .Values.dra.enabled }}
{{- if or (eq (toString $on) "true") (and (eq (toString $on) "auto") (.Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceClass")) }}true{{ end }}
{{- end }}

{{/*
The names of the pools DRA serves (a DeviceClass each): those of
config.pools and of the per-node overrides, once each, whose servedBy is
dra, or empty while dra.servedBy is dra. A JSON list.
*/}}
{{- define "xdpq.draPools" -}}
{{- $names := list }}
{{- $pools := .Values.config.pools | default list }}
{{- range .Values.config.nodes | default list }}
{{- $pools = concat $pools (.pools | default list) }}
{{- end }}
{{- range $pools }}
{{- $by := default $.Values.dra.servedBy .servedBy }}
{{- if and (eq $by "dra") (not (has .name $names)) }}
{{- $names = append $names .name }}
{{- end }}
{{- end }}
{{- toJson $names }}
{{- end }}
