{{/*
webhooks.yaml of the settings ConfigMap: the MutatingWebhookConfiguration and the
ValidatingWebhookConfiguration exactly as the reconciler registers them, once the webhook serves,
with clientConfig.caBundle set from ca.crt of the serving Secret and an owner reference to the
install's ClusterRole (so uninstalling removes them). No caBundle here: the reconciler keeps it.
*/}}
{{- define "volcano-job-webhook.namespaceSelector" -}}
{{- if .Values.webhook.namespaceSelector }}
{{- $selector := deepCopy .Values.webhook.namespaceSelector }}
{{- $own := dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" (list .Release.Namespace) }}
{{- $_ := set $selector "matchExpressions" (append (default (list) $selector.matchExpressions) $own) }}
{{- toYaml $selector }}
{{- else -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: [{{ .Release.Namespace | quote }}, "kube-system"]
{{- end }}
{{- end }}

{{- define "volcano-job-webhook.clientConfig" -}}
clientConfig:
  service:
    namespace: {{ .root.Release.Namespace }}
    name: {{ include "volcano-job-webhook.fullname" .root }}
    path: {{ .path }}
    port: 443
{{- end }}

{{- define "volcano-job-webhook.webhookLabels" -}}
app.kubernetes.io/name: {{ include "volcano-job-webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: volcano-job-webhook
{{- end }}

{{- define "volcano-job-webhook.webhooks" -}}
# The webhook configurations the reconciler registers once a webhook Pod is Ready (and keeps:
# drift repaired, caBundle following ca.crt of Secret {{ include "volcano-job-webhook.tlsSecret" . }}).
# No clientConfig.caBundle here: the reconciler sets it.
#
# Wires the Pods of Volcano jobs as they are created (docs/install.md, "Webhook settings"), and
# the Pods of Indexed Jobs and JobSets whose template opts in (docs/workloads.md).
- apiVersion: admissionregistration.k8s.io/v1
  kind: MutatingWebhookConfiguration
  metadata:
    name: {{ include "volcano-job-webhook.fullname" . }}
    labels:
      {{- include "volcano-job-webhook.webhookLabels" . | nindent 6 }}
  webhooks:
    - name: pods.volcano-job-webhook.io
      admissionReviewVersions: ["v1", "v1beta1"]
      {{- include "volcano-job-webhook.clientConfig" (dict "root" . "path" "/mutate") | nindent 6 }}
      rules:
        - operations: ["CREATE"]
          apiGroups: [""]
          apiVersions: ["v1"]
          resources: ["pods"]
          scope: Namespaced
      matchPolicy: Equivalent
      # Only Pods that Volcano's job controller made. Every other Pod of the cluster is admitted
      # without calling us, so even a webhook outage cannot touch them.
      objectSelector:
        matchExpressions:
          - key: volcano.sh/job-name
            operator: Exists
      # Never our own namespace (the webhook must not gate its own Pods) nor kube-system.
      namespaceSelector:
        {{- include "volcano-job-webhook.namespaceSelector" . | nindent 8 }}
      sideEffects: None
      # Fail closed. With Ignore, an outage would let Pods through unwired: no VC_TASK_INDEX, no
      # MASTER_ADDR, no host files, no SSH keys. They would start and then fail at run time in
      # ways that point nowhere near this webhook. With Fail, an outage blocks only the Pods of
      # Volcano jobs (objectSelector), the job controller retries their creation, and they come
      # out right once the webhook is back. Two replicas, anti-affinity and a
      # PodDisruptionBudget keep outages rare; registering only once a Pod is Ready keeps
      # install and upgrade from refusing any.
      failurePolicy: Fail
      # Every Volcano job's Pod creation waits on this call. The work is in memory and takes
      # milliseconds; the slowest path is a Job-cache miss, one GET to the API server bounded at
      # 2 s. 5 s covers that; a stuck webhook must not hold the job controller for the 10 s default.
      timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
      # If a webhook called after us adds a container or an init container, we are called again
      # to wire it. Our patches are idempotent: on an already wired Pod the patch is empty.
      reinvocationPolicy: IfNeeded
    # The Pods of Indexed Jobs and JobSets whose Pod template carries the opt-in label
    # (docs/workloads.md): no other Pod of the cluster reaches us, so a workload that did not opt
    # in is never blocked by a webhook outage. Everything else as above.
    - name: workloads.volcano-job-webhook.io
      admissionReviewVersions: ["v1", "v1beta1"]
      {{- include "volcano-job-webhook.clientConfig" (dict "root" . "path" "/mutate") | nindent 6 }}
      rules:
        - operations: ["CREATE"]
          apiGroups: [""]
          apiVersions: ["v1"]
          resources: ["pods"]
          scope: Namespaced
      matchPolicy: Equivalent
      objectSelector:
        matchLabels:
          volcano-job-webhook/enabled: "true"
        # A Volcano job's Pod with the label too is the entry above's.
        matchExpressions:
          - key: volcano.sh/job-name
            operator: DoesNotExist
      namespaceSelector:
        {{- include "volcano-job-webhook.namespaceSelector" . | nindent 8 }}
      sideEffects: None
      failurePolicy: Fail
      # An Indexed Job or JobSet is not cached: its Pods' lookups are a GET each (reused for 5 s).
      timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
      reinvocationPolicy: IfNeeded
# Checks a Volcano Job's plugins (and an Indexed Job's or JobSet's that names them) when it is
# created or updated, and denies a Job whose Pods would be denied, with the same message — at
# `kubectl apply` time instead of in the job's events.
- apiVersion: admissionregistration.k8s.io/v1
  kind: ValidatingWebhookConfiguration
  metadata:
    name: {{ include "volcano-job-webhook.fullname" . }}
    labels:
      {{- include "volcano-job-webhook.webhookLabels" . | nindent 6 }}
  webhooks:
    - name: jobs.volcano-job-webhook.io
      admissionReviewVersions: ["v1", "v1beta1"]
      {{- include "volcano-job-webhook.clientConfig" (dict "root" . "path" "/validate") | nindent 6 }}
      # `jobs` only: status updates by Volcano's controller go to jobs/status and do not call us.
      rules:
        - operations: ["CREATE", "UPDATE"]
          apiGroups: ["batch.volcano.sh"]
          apiVersions: ["v1alpha1"]
          resources: ["jobs"]
          scope: Namespaced
      matchPolicy: Equivalent
      namespaceSelector:
        {{- include "volcano-job-webhook.namespaceSelector" . | nindent 8 }}
      sideEffects: None
      # Fail open. This check only moves an error earlier: a Job it would deny is still stopped,
      # Pod by Pod, by the mutating webhook (which fails closed) with the same message. Failing
      # closed here would make a webhook outage block every Volcano Job create and update for no
      # safety gain.
      failurePolicy: Ignore
      # No lookups (the Job is in the request): it answers in well under a millisecond. Short,
      # because while the webhook is unreachable each Job write still waits this long.
      timeoutSeconds: {{ .Values.webhook.validatingTimeoutSeconds }}
    # Indexed Jobs and JobSets that name plugins in our annotation (docs/workloads.md); the
    # matchConditions keep every other batch Job of the cluster from calling us at all.
    - name: workloads.volcano-job-webhook.io
      admissionReviewVersions: ["v1", "v1beta1"]
      {{- include "volcano-job-webhook.clientConfig" (dict "root" . "path" "/validate") | nindent 6 }}
      rules:
        - operations: ["CREATE", "UPDATE"]
          apiGroups: ["batch"]
          apiVersions: ["v1"]
          resources: ["jobs"]
          scope: Namespaced
        - operations: ["CREATE", "UPDATE"]
          apiGroups: ["jobset.x-k8s.io"]
          apiVersions: ["v1alpha2"]
          resources: ["jobsets"]
          scope: Namespaced
      matchPolicy: Equivalent
      matchConditions:
        - name: names-plugins
          expression: "has(object.metadata.annotations) && 'volcano-job-webhook/plugins' in object.metadata.annotations"
      namespaceSelector:
        {{- include "volcano-job-webhook.namespaceSelector" . | nindent 8 }}
      sideEffects: None
      failurePolicy: Ignore
      timeoutSeconds: {{ .Values.webhook.validatingTimeoutSeconds }}
{{- end }}
