{{/* Names and labels shared by every template. */}}

{{- define "ascend-serve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ascend-serve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ascend-serve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ascend-serve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ascend-serve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ascend-serve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ascend-serve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ascend-serve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* preStop sleep + the server's drain + a margin: SIGKILL never cuts a drain short. */}}
{{- define "ascend-serve.terminationGracePeriodSeconds" -}}
{{- add .Values.shutdown.preStopSleepSeconds (ceil .Values.server.exitTimeoutSecs) .Values.shutdown.graceMarginSeconds -}}
{{- end -}}

{{/* The server's command line (the image's entrypoint runs ascend-serve with it). */}}
{{- define "ascend-serve.args" -}}
- --model-repository={{ .Values.modelRepository.path }}
- --http-port={{ .Values.server.httpPort }}
- --grpc-port={{ .Values.server.grpcPort }}
- --metrics-port={{ .Values.server.metricsPort }}
- --exit-timeout-secs={{ .Values.server.exitTimeoutSecs }}
- --strict-readiness={{ .Values.server.strictReadiness }}
- --model-control-mode={{ .Values.server.modelControlMode }}
- --log-verbose={{ .Values.server.logVerbose }}
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "ascend-serve.probeTimes" -}}
periodSeconds: {{ .periodSeconds }}
failureThreshold: {{ .failureThreshold }}
timeoutSeconds: {{ .timeoutSeconds }}
{{- end -}}
