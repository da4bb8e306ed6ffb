{{/*
Chart name, truncated to the 63 characters a label value allows.
Usage: {{ include "deepspec.name" . }}
*/}}
{{- define "deepspec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Resource-name prefix: `<release>-<chart>`, or the release name alone when it already contains the chart name.
Usage: {{ include "deepspec.fullname" . }}
*/}}
{{- define "deepspec.fullname" -}}
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

{{/*
Name of one component's resources, e.g. `deepspec-gateway`.
Usage: {{ include "deepspec.componentName" (dict "ctx" . "component" "gateway") }}
*/}}
{{- define "deepspec.componentName" -}}
{{- printf "%s-%s" (include "deepspec.fullname" .ctx | trunc 54 | trimSuffix "-") .component }}
{{- end }}

{{/*
Chart label value: `<name>-<version>`.
Usage: {{ include "deepspec.chart" . }}
*/}}
{{- define "deepspec.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every resource: the selector labels plus chart, version, part-of, managed-by and `commonLabels`.
Usage: {{ include "deepspec.labels" (dict "ctx" . "component" "gateway") }}
*/}}
{{- define "deepspec.labels" -}}
helm.sh/chart: {{ include "deepspec.chart" .ctx }}
{{ include "deepspec.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: deepspec
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels: name, instance and component. Never change them: a Deployment's selector is immutable.
Usage: {{ include "deepspec.selectorLabels" (dict "ctx" . "component" "worker") }}
*/}}
{{- define "deepspec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "deepspec.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
ServiceAccount the pods run as.
Usage: {{ include "deepspec.serviceAccountName" . }}
*/}}
{{- define "deepspec.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "deepspec.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "Value 'serviceAccount.name' must be defined when serviceAccount.create is false !" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference `<repository>:<tag>`, the tag defaulting to the chart's appVersion.
Usage: {{ include "deepspec.image" (dict "ctx" . "image" .Values.gateway.image) }}
*/}}
{{- define "deepspec.image" -}}
{{- printf "%s:%s" (required "Value 'image.repository' must be defined !" .image.repository) (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/*
Worker image: `worker.image.repository`, or the GPU/CPU image picked by `worker.device`.
Usage: {{ include "deepspec.workerImage" . }}
*/}}
{{- define "deepspec.workerImage" -}}
{{- $repository := .Values.worker.image.repository | default (printf "ghcr.io/deepspec/worker-%s" (ternary "gpu" "cpu" (eq .Values.worker.device "cuda"))) }}
{{- include "deepspec.image" (dict "ctx" . "image" (dict "repository" $repository "tag" .Values.worker.image.tag)) }}
{{- end }}

{{/*
Weights dtype: `model.dtype`, or bfloat16 (the worker's default on cpu and cuda alike).
Usage: {{ include "deepspec.dtype" . }}
*/}}
{{- define "deepspec.dtype" -}}
{{- .Values.model.dtype | default "bfloat16" }}
{{- end }}

{{/*
Inference backend of a DeepSpec worker: `model.backend`, or its deprecated name `model.engine` where set. A weight
format (`model.quantization`) the backend does not take fails the render, as the worker would refuse it at start
(`auto` takes every one: it weighs the backends that honour it); the table mirrors deepspec/models/backends.py
(tests/helm/test_backend_values.py keeps the two equal).
Usage: {{ include "deepspec.backend" . }}
*/}}
{{- define "deepspec.backend" -}}
{{- $backend := .Values.model.engine | default .Values.model.backend -}}
{{- $takes := dict "auto" (list "auto" "none" "gguf" "int8" "int4") "pytorch" (list "auto" "none" "gguf") "onnx" (list "auto" "none" "int8" "int4") "native" (list "auto" "int8" "int4") -}}
{{- $q := .Values.model.quantization -}}
{{- $b := include "deepspec.worker.bundles" . | fromYaml -}}
{{- if and (eq .Values.worker.runtime "deepspec") (eq $b.source "none") (not (has $q (get $takes $backend))) -}}
{{- fail (printf "model.quantization=%s does not apply to model.backend=%s: it takes %s" $q $backend (join ", " (get $takes $backend))) -}}
{{- end -}}
{{- $backend -}}
{{- end }}

{{/*
Where the worker's bundle (`python -m export` output) comes from: `worker.bundles`, with the deprecated
`worker.engines` of an older values file merged in for one release. An old key is read where its `worker.bundles`
twin is left at the chart's default (the defaults below; tests/helm/test_bundle_values.py keeps them equal to
values.yaml), so an old file renders what the same keys under `worker.bundles` render. Maps (`resources`) merge into
the default as Helm merges a values file.
Usage: {{- $b := include "deepspec.worker.bundles" . | fromYaml }}
*/}}
{{- define "deepspec.worker.bundles" -}}
{{- $new := deepCopy .Values.worker.bundles }}
{{- $default := include "deepspec.worker.bundleDefaults" . | fromYaml }}
{{- range $key, $old := .Values.worker.engines | default dict }}
{{- $defaultValue := get $default $key }}
{{- if and (kindIs "map" $old) (kindIs "map" $defaultValue) }}
{{- $section := get $new $key }}
{{- range $sub, $oldSub := $old }}
{{- $defaultSub := get $defaultValue $sub }}
{{- if eq (toJson (get $section $sub)) (toJson $defaultSub) }}
{{- if and (kindIs "map" $oldSub) (kindIs "map" $defaultSub) }}
{{- $_ := set $section $sub (mergeOverwrite (deepCopy $defaultSub) $oldSub) }}
{{- else }}
{{- $_ := set $section $sub $oldSub }}
{{- end }}
{{- end }}
{{- end }}
{{- else if eq (toJson (get $new $key)) (toJson $defaultValue) }}
{{- $_ := set $new $key $old }}
{{- end }}
{{- end }}
{{- toYaml $new }}
{{- end }}

{{/*
values.yaml's `worker.bundles`, the defaults "deepspec.worker.bundles" compares against (a template cannot read the
chart's own defaults apart from the user's values).
*/}}
{{- define "deepspec.worker.bundleDefaults" -}}
source: none
mountPath: /bundles
subPath: bundle
pvc:
  existingClaim: ""
  size: 50Gi
  storageClass: ""
  accessModes: [ReadOnlyMany]
export:
  format: ""
  extraArgs: []
  resources:
    requests:
      cpu: "2"
      memory: 16Gi
    limits:
      memory: 16Gi
emptyDirSizeLimit: 50Gi
{{- end }}

{{/*
Export format for the init container: `worker.bundles.export.format`, or triton-repo (triton runtime) / pytorch.
Usage: {{ include "deepspec.exportFormat" . }}
*/}}
{{- define "deepspec.exportFormat" -}}
{{- $byRuntime := dict "triton" "triton-repo" "vllm" "vllm" "sglang" "sglang" "trtllm-serve" "tensorrt-llm" }}
{{- $b := include "deepspec.worker.bundles" . | fromYaml }}
{{- $b.export.format | default (get $byRuntime .Values.worker.runtime) | default "pytorch" }}
{{- end }}

{{/*
Whether the worker is an engine's own OpenAI-compatible server (vllm, sglang, trtllm-serve): "true" or "".
Usage: {{ if include "deepspec.openaiRuntime" . }}
*/}}
{{- define "deepspec.openaiRuntime" -}}
{{- if has .Values.worker.runtime (list "vllm" "sglang" "trtllm-serve") }}true{{ end }}
{{- end }}

{{/*
The port the gateway sends requests to: the engine's HTTP port (OpenAI runtimes) or the worker's gRPC port.
Usage: {{ include "deepspec.workerApiPort" . }}
*/}}
{{- define "deepspec.workerApiPort" -}}
{{- ternary .Values.worker.openai.httpPort .Values.worker.grpcPort (eq (include "deepspec.openaiRuntime" .) "true") | int }}
{{- end }}

{{/*
Worker discovery address for `--workers`: DNS of the headless worker Service and its gRPC port, or with
`gateway.discovery=endpointslices` the Service and its port name, whose EndpointSlices the gateway watches.
Usage: {{ include "deepspec.workersAddress" . }}
*/}}
{{- define "deepspec.workersAddress" -}}
{{- $svc := include "deepspec.componentName" (dict "ctx" . "component" "worker") }}
{{- if eq .Values.gateway.discovery "endpointslices" }}
{{- printf "k8s://%s.%s:%s" $svc .Release.Namespace (ternary "http" "grpc" (eq (include "deepspec.openaiRuntime" .) "true")) }}
{{- else }}
{{- printf "dns://%s.%s.svc.%s:%s" $svc .Release.Namespace .Values.clusterDomain (include "deepspec.workerApiPort" .) }}
{{- end }}
{{- end }}

{{/*
Name of the API-key Secret: `apiKeys.existingSecret` or the chart's own.
Usage: {{ include "deepspec.apiKeysSecretName" . }}
*/}}
{{- define "deepspec.apiKeysSecretName" -}}
{{- .Values.apiKeys.existingSecret | default (include "deepspec.componentName" (dict "ctx" . "component" "api-keys")) }}
{{- end }}

{{/*
Whether the Prometheus Operator objects render: enabled, and the CRDs exist or `monitoring.skipWithoutCRDs` is off.
Usage: {{ if include "deepspec.monitoringCRDs" . }}
*/}}
{{- define "deepspec.monitoringCRDs" -}}
{{- if or (not .Values.monitoring.skipWithoutCRDs) (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{- end }}
{{- end }}

{{/*
Writable scratch volumes the gateway needs under a read-only root filesystem (it loads no model: small caches).
Their sizes add up to `deepspec.gatewayEphemeralStorage`.
Usage: {{- include "deepspec.scratchVolumes" . | nindent 8 }}
*/}}
{{- define "deepspec.scratchVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
- name: cache
  emptyDir:
    sizeLimit: 1Gi
{{- end }}

{{/*
Ephemeral storage the gateway's scratch volumes may fill (requested, so the scheduler counts it).
Usage: {{ include "deepspec.gatewayEphemeralStorage" . }}
*/}}
{{- define "deepspec.gatewayEphemeralStorage" -}}
2Gi
{{- end }}

{{/*
A Kubernetes quantity in Mi: "20Gi" -> 20480. Only binary units (Mi, Gi, Ti), which is what sizes here use.
Usage: {{ include "deepspec.mebibytes" "20Gi" }}
*/}}
{{- define "deepspec.mebibytes" -}}
{{- $q := toString . }}
{{- if hasSuffix "Ti" $q }}{{ mul (trimSuffix "Ti" $q | int) 1048576 }}
{{- else if hasSuffix "Gi" $q }}{{ mul (trimSuffix "Gi" $q | int) 1024 }}
{{- else if hasSuffix "Mi" $q }}{{ trimSuffix "Mi" $q | int }}
{{- else }}{{ fail (printf "size %q: write it in Mi, Gi or Ti (e.g. 20Gi)" $q) }}
{{- end }}
{{- end }}

{{/*
Whether pods carry `prometheus.io/*` scrape annotations: asked for, and no ServiceMonitor scrapes them already
(two scrape paths would double every series).
Usage: {{ if include "deepspec.scrapeAnnotations" . }}
*/}}
{{- define "deepspec.scrapeAnnotations" -}}
{{- if and .Values.monitoring.podAnnotations (not (and .Values.monitoring.serviceMonitor.enabled (include "deepspec.monitoringCRDs" .))) }}true{{- end }}
{{- end }}

{{/*
Seconds a pod needs from "terminating" to exit: the preStop sleep, the drain, and 15 s for the process to close
its servers. terminationGracePeriodSeconds is derived from it, so the kubelet never kills a drain.
Usage: {{ include "deepspec.gracePeriod" (dict "preStop" 10 "drain" 300) }}
*/}}
{{- define "deepspec.gracePeriod" -}}
{{- add (int .preStop) (int .drain) 15 }}
{{- end }}

{{/*
Mounts and environment matching deepspec.scratchVolumes: caches (Hugging Face, ~/.cache/deepspec) go to /cache.
Usage: {{- include "deepspec.scratchMounts" . | nindent 12 }}
*/}}
{{- define "deepspec.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /cache
{{- end }}

{{/*
Environment that points caches at the writable /cache mount and keeps Python from writing bytecode.
Usage: {{- include "deepspec.scratchEnv" . | nindent 12 }}
*/}}
{{- define "deepspec.scratchEnv" -}}
- name: HOME
  value: /cache
- name: XDG_CACHE_HOME
  value: /cache
- name: HF_HOME
  value: /cache/huggingface
- name: DEEPSPEC_CACHE_DIR
  value: /cache/deepspec
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
{{- end }}
