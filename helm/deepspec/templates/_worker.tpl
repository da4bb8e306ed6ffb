{{/*
Fail early on value combinations the worker cannot run with, naming the setting to change.
Usage: {{- include "deepspec.worker.validate" . }}
*/}}
{{- define "deepspec.worker.validate" -}}
{{- $w := .Values.worker }}
{{- if eq $w.runtime "triton" }}
{{- if eq $w.engines.source "none" }}
{{- fail "worker.runtime=triton serves an exported model repository: set worker.engines.source to image, pvc or export (python -m export --format triton-repo)" }}
{{- end }}
{{- if ne $w.device "cuda" }}
{{- fail "worker.runtime=triton runs the TensorRT-LLM backend and needs worker.device=cuda; use worker.runtime=deepspec on CPU" }}
{{- end }}
{{- end }}
{{- if and (eq $w.engines.source "pvc") $w.perReplicaVolume.enabled }}
{{- fail "worker.engines.source=pvc mounts one shared claim; use worker.engines.source=export with worker.perReplicaVolume.enabled for a claim per replica" }}
{{- end }}
{{- end }}

{{/*
Container resources: `worker.resources` plus `worker.gpu.count` GPUs on cuda (requests and limits must match
for extended resources).
Usage: {{- include "deepspec.worker.resources" (dict "ctx" . "resources" .Values.worker.resources) | nindent 12 }}
*/}}
{{- define "deepspec.worker.resources" -}}
{{- $res := deepCopy .resources }}
{{- $w := .ctx.Values.worker }}
{{- if eq $w.device "cuda" }}
{{- $gpu := dict $w.gpu.resourceName (int $w.gpu.count) }}
{{- $_ := set $res "requests" (merge (deepCopy $gpu) ($res.requests | default dict)) }}
{{- $_ := set $res "limits" (merge (deepCopy $gpu) ($res.limits | default dict)) }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{/*
Name of the volume holding engines, or "" when nothing is mounted (engines baked into the image, or none).
Usage: {{ include "deepspec.worker.enginesVolume" . }}
*/}}
{{- define "deepspec.worker.enginesVolume" -}}
{{- if has .Values.worker.engines.source (list "pvc" "export") }}engines{{ end }}
{{- end }}

{{/*
Worker pod template, shared by the Deployment and the StatefulSet.
Usage: {{- include "deepspec.worker.podTemplate" . | nindent 4 }}
*/}}
{{- define "deepspec.worker.podTemplate" -}}
{{- $ctx := dict "ctx" . "component" "worker" }}
{{- $w := .Values.worker }}
{{- $triton := eq $w.runtime "triton" }}
{{- $cuda := eq $w.device "cuda" }}
{{- $enginesVolume := include "deepspec.worker.enginesVolume" . }}
{{- $perReplica := $w.perReplicaVolume.enabled }}
{{- $configMap := include "deepspec.componentName" (dict "ctx" . "component" "model") -}}
metadata:
  labels:
    {{- include "deepspec.labels" $ctx | nindent 4 }}
    {{- with $w.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print $.Template.BasePath "/configmap-model.yaml") . | sha256sum }}
    {{- if .Values.monitoring.podAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $w.metricsPort | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with $w.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "deepspec.serviceAccountName" . }}
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $w.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  # Drain must end before the kubelet's SIGKILL.
  terminationGracePeriodSeconds: {{ add $w.drainTimeoutSeconds 15 }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if eq $w.engines.source "export" }}
  initContainers:
    # Exports the engine once; with a per-replica volume a restarted pod finds the manifest and skips it.
    # The export writes to a scratch dir and renames it, so an interrupted export is never mistaken for a done one.
    - name: export-engine
      image: {{ include "deepspec.workerImage" . }}
      imagePullPolicy: {{ $w.image.pullPolicy }}
      command: ["/bin/sh", "-ec"]
      args:
        - |
          out="{{ ternary "$(DEEPSPEC_TRITON_MODEL_REPOSITORY)" "$(DEEPSPEC_ENGINE_DIR)" $triton }}"
          if [ -f "$out/manifest.json" ]; then
            echo "engine already exported at $out"; exit 0
          fi
          rm -rf "$out.partial"
          python -m export --target "$DEEPSPEC_TARGET" --draft "$DEEPSPEC_DRAFT" \
            --format "$DEEPSPEC_EXPORT_FORMAT" --out "$out.partial" {{- range $w.engines.export.extraArgs }} {{ . | quote }}{{ end }}
          mv "$out.partial" "$out"
      envFrom:
        - configMapRef:
            name: {{ $configMap }}
      env:
        {{- include "deepspec.scratchEnv" . | nindent 8 }}
      resources:
        {{- include "deepspec.worker.resources" (dict "ctx" . "resources" $w.engines.export.resources) | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: engines
          mountPath: {{ $w.engines.mountPath }}
        {{- include "deepspec.scratchMounts" . | nindent 8 }}
        {{- if $w.shm.enabled }}
        - name: shm
          mountPath: /dev/shm
        {{- end }}
  {{- end }}
  containers:
    - name: worker
      {{- if $triton }}
      image: {{ include "deepspec.image" (dict "ctx" . "image" $w.triton.image) }}
      imagePullPolicy: {{ $w.triton.image.pullPolicy }}
      command: ["tritonserver"]
      args:
        - --model-repository=$(DEEPSPEC_TRITON_MODEL_REPOSITORY)
        - --http-port={{ $w.triton.httpPort }}
        - --grpc-port={{ $w.grpcPort }}
        - --metrics-port={{ $w.metricsPort }}
        - --allow-metrics=true
        - --exit-on-error=true
        {{- with $w.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- else }}
      image: {{ include "deepspec.workerImage" . }}
      imagePullPolicy: {{ $w.image.pullPolicy }}
      command: ["python", "-m", "service", "worker"]
      # $(VAR) is expanded by Kubernetes from the ConfigMap below.
      args:
        {{- if eq $w.engines.source "none" }}
        - --target=$(DEEPSPEC_TARGET)
        - --draft=$(DEEPSPEC_DRAFT)
        {{- end }}
        - --port={{ $w.grpcPort }}
        - --metrics-port={{ $w.metricsPort }}
        - --device=$(DEEPSPEC_DEVICE)
        - --dtype=$(DEEPSPEC_DTYPE)
        - --quantization=$(DEEPSPEC_QUANTIZATION)
        - --max-batch-size=$(DEEPSPEC_MAX_BATCH_SIZE)
        - --num-speculative-tokens=$(DEEPSPEC_NUM_SPECULATIVE_TOKENS)
        - --max-seq-len=$(DEEPSPEC_MAX_SEQ_LEN)
        - --max-queue=$(DEEPSPEC_MAX_QUEUE)
        - --drain-timeout-s={{ $w.drainTimeoutSeconds }}
        {{- if ne $w.engines.source "none" }}
        # Target and draft come from the engine's manifest.json (flags would override it).
        - --engine-dir=$(DEEPSPEC_ENGINE_DIR)
        {{- end }}
        {{- with $w.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      envFrom:
        - configMapRef:
            name: {{ $configMap }}
      env:
        {{- include "deepspec.scratchEnv" . | nindent 8 }}
        {{- with $w.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: grpc
          containerPort: {{ $w.grpcPort }}
          protocol: TCP
        - name: metrics
          containerPort: {{ $w.metricsPort }}
          protocol: TCP
        {{- if $triton }}
        - name: http
          containerPort: {{ $w.triton.httpPort }}
          protocol: TCP
        {{- end }}
      # Model loads take minutes: the startup probe holds liveness off for up to startupBudgetSeconds.
      startupProbe:
        {{- if $triton }}
        httpGet:
          path: /v2/health/ready
          port: http
        {{- else }}
        grpc:
          port: {{ $w.grpcPort }}
        {{- end }}
        periodSeconds: {{ $w.probes.startup.periodSeconds }}
        timeoutSeconds: {{ $w.probes.startup.timeoutSeconds }}
        failureThreshold: {{ div (add $w.startupBudgetSeconds $w.probes.startup.periodSeconds -1) $w.probes.startup.periodSeconds }}
      # Ready = ServerReady: the engine is loaded and the model answers.
      readinessProbe:
        {{- if $triton }}
        httpGet:
          path: /v2/health/ready
          port: http
        {{- else }}
        grpc:
          port: {{ $w.grpcPort }}
        {{- end }}
        {{- toYaml $w.probes.readiness | nindent 8 }}
      # Liveness stays cheap: a busy worker must not be killed for being slow to answer a health RPC.
      livenessProbe:
        {{- if $triton }}
        httpGet:
          path: /v2/health/live
          port: http
        {{- else }}
        tcpSocket:
          port: grpc
        {{- end }}
        {{- toYaml $w.probes.liveness | nindent 8 }}
      resources:
        {{- include "deepspec.worker.resources" (dict "ctx" . "resources" $w.resources) | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        {{- if $enginesVolume }}
        - name: engines
          mountPath: {{ $w.engines.mountPath }}
          readOnly: true
        {{- end }}
        - name: tmp
          mountPath: /tmp
        - name: {{ ternary "data" "cache" (and $perReplica (ne $w.engines.source "export")) }}
          mountPath: /cache
        {{- if $w.shm.enabled }}
        - name: shm
          mountPath: /dev/shm
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 1Gi
    {{- if not (and $perReplica (ne $w.engines.source "export")) }}
    - name: cache
      emptyDir:
        sizeLimit: 20Gi
    {{- end }}
    {{- if $w.shm.enabled }}
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $w.shm.sizeLimit }}
    {{- end }}
    {{- if eq $w.engines.source "pvc" }}
    - name: engines
      persistentVolumeClaim:
        claimName: {{ $w.engines.pvc.existingClaim | default (include "deepspec.componentName" (dict "ctx" . "component" "engines")) }}
        readOnly: true
    {{- else if and (eq $w.engines.source "export") (not $perReplica) }}
    - name: engines
      emptyDir:
        sizeLimit: {{ $w.engines.emptyDirSizeLimit }}
    {{- end }}
  {{- with $w.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := $w.tolerations }}
  {{- if and $cuda $w.gpu.tolerate }}
  {{- $tolerations = prepend $tolerations (dict "key" $w.gpu.resourceName "operator" "Exists" "effect" "NoSchedule") }}
  {{- end }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
