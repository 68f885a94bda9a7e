{{/*
Names. The default release name volcano-job-webhook gives the names docs/install.md uses.
*/}}
{{- define "volcano-job-webhook.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "volcano-job-webhook.fullname" -}}
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

{{- define "volcano-job-webhook.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The serving certificate's Secret (tls.crt, tls.key, ca.crt), mounted by the webhook. */}}
{{- define "volcano-job-webhook.tlsSecret" -}}
{{- include "volcano-job-webhook.fullname" . }}-tls
{{- end }}

{{/* The CA's key (self-managed) or the CA Certificate's Secret (cert-manager); mounted nowhere. */}}
{{- define "volcano-job-webhook.caSecret" -}}
{{- include "volcano-job-webhook.fullname" . }}-ca
{{- end }}

{{- define "volcano-job-webhook.configMap" -}}
{{- include "volcano-job-webhook.fullname" . }}-config
{{- end }}

{{- define "volcano-job-webhook.lease" -}}
{{- include "volcano-job-webhook.fullname" . }}-reconciler
{{- end }}

{{/* The ServiceAccount of the webhook (and, in the sidecar layout, of the reconciler). */}}
{{- define "volcano-job-webhook.serviceAccount" -}}
{{- include "volcano-job-webhook.fullname" . }}
{{- end }}

{{/* The identity the reconciler runs as: its own ServiceAccount only in the split layout. */}}
{{- define "volcano-job-webhook.reconcilerServiceAccount" -}}
{{- if eq .Values.layout "split" }}
{{- include "volcano-job-webhook.fullname" . }}-reconciler
{{- else }}
{{- include "volcano-job-webhook.serviceAccount" . }}
{{- end }}
{{- end }}

{{/* The image, by digest when one is given. */}}
{{- define "volcano-job-webhook.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Labels. Selectors carry name and component only, as the manifests always did: a Deployment's
selector cannot change, so an install from an older manifests/ upgrades in place.
*/}}
{{- define "volcano-job-webhook.labels" -}}
helm.sh/chart: {{ include "volcano-job-webhook.chart" . }}
app.kubernetes.io/name: {{ include "volcano-job-webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: volcano-job-webhook
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "volcano-job-webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "volcano-job-webhook.name" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* A Pod template's labels: the selector's, plus the release, part-of and version. */}}
{{- define "volcano-job-webhook.podLabels" -}}
{{ include "volcano-job-webhook.selectorLabels" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/part-of: volcano-job-webhook
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- end }}

{{/* The settings ConfigMap's checksum: a change of settings rolls every Pod that mounts it. */}}
{{- define "volcano-job-webhook.podAnnotations" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod-level scheduling settings shared by the Deployments. */}}
{{- define "volcano-job-webhook.scheduling" -}}
{{- with .root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
{{- if .root.Values.affinity }}
  {{- toYaml .root.Values.affinity | nindent 2 }}
{{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "volcano-job-webhook.selectorLabels" . | nindent 14 }}
{{- end }}
{{- end }}

{{- define "volcano-job-webhook.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Every container's security context: Pod Security "restricted" and a read-only root. */}}
{{- define "volcano-job-webhook.containerSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities:
    drop: ["ALL"]
{{- end }}

{{/* Where both containers read config.yaml and webhooks.yaml (VOLCANO_WEBHOOK_CONFIG). */}}
{{- define "volcano-job-webhook.settingsMount" -}}
- name: settings
  mountPath: /etc/volcano-job-webhook
  readOnly: true
{{- end }}

{{- define "volcano-job-webhook.settingsEnv" -}}
- name: VOLCANO_WEBHOOK_CONFIG
  value: /etc/volcano-job-webhook/config.yaml
{{- end }}

{{- define "volcano-job-webhook.settingsVolume" -}}
- name: settings
  configMap:
    name: {{ include "volcano-job-webhook.configMap" . }}
{{- end }}

{{/*
The reconciler container, the same in both layouts; the split layout adds a readiness probe.
*/}}
{{- define "volcano-job-webhook.reconcilerContainer" -}}
- name: reconciler
  image: {{ include "volcano-job-webhook.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - reconcile
    - --health-port=8081
    - --leader-elect
    - --lease-name={{ include "volcano-job-webhook.lease" . }}
    - --lease-namespace={{ .Release.Namespace }}
  env:
    {{- include "volcano-job-webhook.settingsEnv" . | nindent 4 }}
    # The leader-election identity: the Pod's name, as the Lease's holderIdentity.
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
  ports:
    - name: health
      containerPort: 8081
      protocol: TCP
  startupProbe:
    httpGet:
      path: /healthz
      port: health
      scheme: HTTP
    periodSeconds: 2
    failureThreshold: 30
  livenessProbe:
    httpGet:
      path: /healthz
      port: health
      scheme: HTTP
    periodSeconds: 10
    timeoutSeconds: 3
    failureThreshold: 3
  {{- if eq .Values.layout "split" }}
  # In a Pod of its own its readiness gates nothing but its Deployment's rollout (Job cache
  # synced, leader or not).
  readinessProbe:
    httpGet:
      path: /readyz
      port: health
      scheme: HTTP
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 2
  {{- end }}
  resources:
    {{- toYaml .Values.reconciler.resources | nindent 4 }}
  {{- include "volcano-job-webhook.containerSecurityContext" . | nindent 2 }}
  volumeMounts:
    {{- include "volcano-job-webhook.settingsMount" . | nindent 4 }}
    - name: tmp
      mountPath: /tmp
{{- end }}
