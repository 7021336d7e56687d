{{/* The release's base name, a DNS label. */}}
{{- define "delayq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "delayq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Must equal delayq.kube.naming.OPERATOR_POD_LABELS: topic NetworkPolicies admit these pods. */}}
{{- define "delayq.operatorSelector" -}}
app.kubernetes.io/name: delayq-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "delayq.zookeeperSelector" -}}
app.kubernetes.io/name: delayq-zookeeper
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "delayq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "delayq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "delayq.image" -}}
{{- include "delayq.pinnedImage" (list (printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag)) .Values.image.digest) -}}
{{- end -}}

{{/* (list "<repository>:<tag>" "<digest>"): the reference as given, or <repository>@<digest>
when a digest is set (the tag dropped: the digest alone names the content). */}}
{{- define "delayq.pinnedImage" -}}
{{- $ref := index . 0 -}}
{{- $digest := index . 1 -}}
{{- if $digest -}}
{{- printf "%s@%s" (regexReplaceAll ":[^:/]+$" $ref "") $digest -}}
{{- else -}}
{{- $ref -}}
{{- end -}}
{{- end -}}

{{/* The ZooKeeper connection string: the bundled ensemble, else the given address. */}}
{{- define "delayq.zookeeperAddress" -}}
{{- if .Values.zookeeper.enabled -}}
{{- printf "%s-zookeeper.%s.svc:2181" (include "delayq.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- required "zookeeper.address is required when zookeeper.enabled is false" .Values.zookeeper.address -}}
{{- end -}}
{{- end -}}

{{- define "delayq.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "delayq.containerSecurityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The Secret holding the operator's ZooKeeper admin password (key admin-password). */}}
{{- define "delayq.zookeeperAdminSecret" -}}
{{- .Values.zookeeper.acl.existingSecret | default (printf "%s-zookeeper-admin" (include "delayq.fullname" .)) -}}
{{- end -}}
