{{/*
Fail early on value combinations the worker cannot run with, naming the setting to change.
Usage: {{- include "deepspec.worker.validate" . }}
*/}}
{{- define "deepspec.worker.validate" -}}
{{- $w := .Values.worker }}
{{- $b := include "deepspec.worker.bundles" . | fromYaml }}
{{- if eq $w.runtime "triton" }}
{{- if eq $b.source "none" }}
{{- fail "worker.runtime=triton serves an exported model repository: set worker.bundles.source to image, pvc or export (python -m export --format triton-repo)" }}
{{- end }}
{{- if ne $w.device "cuda" }}
{{- fail "worker.runtime=triton runs the TensorRT-LLM backend and needs worker.device=cuda; use worker.runtime=deepspec on CPU" }}
{{- end }}
{{- end }}
{{- if include "deepspec.openaiRuntime" . }}
{{- if eq $b.source "none" }}
{{- fail (printf "worker.runtime=%s runs the launch script python -m export --format %s writes: set worker.bundles.source to export (or image/pvc holding that export)" $w.runtime (include "deepspec.exportFormat" .)) }}
{{- end }}
{{- if ne $w.device "cuda" }}
{{- fail (printf "worker.runtime=%s runs the engine's CUDA image and needs worker.device=cuda; use worker.runtime=deepspec on CPU" $w.runtime) }}
{{- end }}
{{- if gt (int $w.openai.tensorParallel) (int $w.gpu.count) }}
{{- fail (printf "worker.openai.tensorParallel = %d ranks, one GPU each: raise worker.gpu.count (%d) to %d" (int $w.openai.tensorParallel) (int $w.gpu.count) (int $w.openai.tensorParallel)) }}
{{- end }}
{{- $own := get (dict "vllm" "vllm" "sglang" "sglang" "trtllm-serve" "tensorrt-llm") $w.runtime }}
{{- if ne (include "deepspec.exportFormat" .) $own }}
{{- fail (printf "worker.runtime=%s runs the launch script of --format %s: worker.bundles.export.format=%s writes another; leave it empty" $w.runtime $own (include "deepspec.exportFormat" .)) }}
{{- end }}
{{- end }}
{{- if and (eq $b.source "pvc") $w.perReplicaVolume.enabled }}
{{- fail "worker.bundles.source=pvc mounts one shared claim; use worker.bundles.source=export with worker.perReplicaVolume.enabled for a claim per replica" }}
{{- end }}
{{- if and (eq $w.modelCache.type "pvc") $w.perReplicaVolume.enabled (ne $b.source "export") }}
{{- fail "worker.perReplicaVolume.enabled already puts /cache on each replica's own claim: drop worker.modelCache.type=pvc, or use worker.bundles.source=export" }}
{{- end }}
{{- $world := int (mul (int $w.triton.tensorParallel) (int $w.triton.pipelineParallel)) }}
{{- if and (eq $w.runtime "triton") (gt $world (int $w.gpu.count)) }}
{{- fail (printf "worker.triton.tensorParallel x pipelineParallel = %d ranks, one GPU each: raise worker.gpu.count (%d) to %d" $world (int $w.gpu.count) $world) }}
{{- end }}
{{- if and $w.gpu.architectures (ne $w.device "cuda") }}
{{- fail "worker.gpu.architectures pins GPU nodes: it needs worker.device=cuda" }}
{{- end }}
{{- if and $w.gpu.architectures (($w.affinity | default dict).nodeAffinity) }}
{{- fail "worker.gpu.architectures writes the node affinity itself: drop worker.affinity.nodeAffinity or worker.gpu.architectures" }}
{{- end }}
{{- if and $w.rollout.progressDeadlineSeconds (lt (int $w.rollout.progressDeadlineSeconds) (int $w.startupBudgetSeconds)) }}
{{- fail (printf "worker.rollout.progressDeadlineSeconds (%d) is shorter than worker.startupBudgetSeconds (%d): every slow start would fail the rollout; raise it or set 0 to derive it" (int $w.rollout.progressDeadlineSeconds) (int $w.startupBudgetSeconds)) }}
{{- end }}
{{- if lt (int .Values.gateway.drainTimeoutSeconds) (int $w.drainTimeoutSeconds) }}
{{- fail (printf "gateway.drainTimeoutSeconds (%d) must be at least worker.drainTimeoutSeconds (%d): a gateway would cut streams its draining worker still finishes" (int .Values.gateway.drainTimeoutSeconds) (int $w.drainTimeoutSeconds)) }}
{{- end }}
{{- if and $w.autoscaling.enabled (gt (int $w.autoscaling.minReplicas) (int $w.autoscaling.maxReplicas)) }}
{{- fail (printf "worker.autoscaling.minReplicas (%d) must not exceed maxReplicas (%d)" (int $w.autoscaling.minReplicas) (int $w.autoscaling.maxReplicas)) }}
{{- end }}
{{- end }}

{{/*
Rollout deadline: `worker.rollout.progressDeadlineSeconds`, or the startup budget plus 10 minutes for scheduling,
image pulls and the export init container.
Usage: {{ include "deepspec.worker.progressDeadline" . }}
*/}}
{{- define "deepspec.worker.progressDeadline" -}}
{{- .Values.worker.rollout.progressDeadlineSeconds | default (add .Values.worker.startupBudgetSeconds 600) }}
{{- end }}

{{/*
Ephemeral storage a worker pod's emptyDir volumes may fill, in Mi: /tmp, the model cache when it is an emptyDir,
and exported bundles when they land in an emptyDir (/dev/shm is memory, not disk).
Usage: {{ include "deepspec.worker.ephemeralStorage" . }}
*/}}
{{- define "deepspec.worker.ephemeralStorage" -}}
{{- $w := .Values.worker }}
{{- $b := include "deepspec.worker.bundles" . | fromYaml }}
{{- $perReplica := $w.perReplicaVolume.enabled }}
{{- $mi := 1024 }}
{{- if and (eq $w.modelCache.type "emptyDir") (not (and $perReplica (ne $b.source "export"))) }}
{{- $mi = add $mi (include "deepspec.mebibytes" $w.modelCache.size) }}
{{- end }}
{{- if and (eq $b.source "export") (not $perReplica) }}
{{- $mi = add $mi (include "deepspec.mebibytes" $b.emptyDirSizeLimit) }}
{{- end }}
{{- printf "%dMi" (int $mi) }}
{{- end }}

{{/*
Container resources: `worker.resources` plus `worker.gpu.count` GPUs on cuda (requests and limits must match
for extended resources) and the ephemeral storage of the pod's emptyDirs (unless set explicitly).
Usage: {{- include "deepspec.worker.resources" (dict "ctx" . "resources" .Values.worker.resources) | nindent 12 }}
*/}}
{{- define "deepspec.worker.resources" -}}
{{- $res := deepCopy .resources }}
{{- $w := .ctx.Values.worker }}
{{- $_ := set $res "requests" (merge ($res.requests | default dict) (dict "ephemeral-storage" (include "deepspec.worker.ephemeralStorage" .ctx))) }}
{{- if eq $w.device "cuda" }}
{{- $gpu := dict $w.gpu.resourceName (int $w.gpu.count) }}
{{- $_ := set $res "requests" (merge (deepCopy $gpu) ($res.requests | default dict)) }}
{{- $_ := set $res "limits" (merge (deepCopy $gpu) ($res.limits | default dict)) }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{/*
Name of the volume holding the bundle, or "" when nothing is mounted (a bundle baked into the image, or none).
Usage: {{ include "deepspec.worker.bundlesVolume" . }}
*/}}
{{- define "deepspec.worker.bundlesVolume" -}}
{{- if has (include "deepspec.worker.bundles" . | fromYaml).source (list "pvc" "export") }}bundles{{ end }}
{{- end }}

{{/*
The engine runtimes (vllm, sglang, trtllm-serve): image values, the launch script `python -m export` writes for the
runtime's format (under `launch/` of the engine dir), and the flags the chart appends to it. The script holds the
target, the draft, tensor parallelism and the speculative settings; the chart adds only what belongs to the pod:
bind address and port, the model's name in the API (`model.target`, as the DeepSpec worker names it; trtllm-serve has
no such flag and names it after the target directory), batch and context limits, metrics, the drain. Each flag is
the engine's own CLI (vllm/entrypoints/openai/cli_args.py, sglang/srt/server_args.py, tensorrt_llm/commands/serve.py).
Usage: {{- $engine := include "deepspec.worker.engine" . | fromYaml }}
*/}}
{{- define "deepspec.worker.engine" -}}
{{- $w := .Values.worker }}
{{- $port := int $w.openai.httpPort }}
{{- if eq $w.runtime "vllm" }}
image: {{ toYaml $w.openai.vllm.image | nindent 2 }}
script: vllm.sh
metricsPath: /metrics
args:
  - --host=0.0.0.0
  - --port={{ $port }}
  - --served-model-name=$(DEEPSPEC_TARGET)
  - --max-num-seqs=$(DEEPSPEC_MAX_BATCH_SIZE)
  {{- if .Values.model.maxSeqLen }}
  - --max-model-len=$(DEEPSPEC_MAX_SEQ_LEN)
  {{- end }}
  - --shutdown-timeout={{ $w.drainTimeoutSeconds }}
{{- else if eq $w.runtime "sglang" }}
image: {{ toYaml $w.openai.sglang.image | nindent 2 }}
script: sglang.sh
metricsPath: /metrics
args:
  - --host=0.0.0.0
  - --port={{ $port }}
  - --served-model-name=$(DEEPSPEC_TARGET)
  - --max-running-requests=$(DEEPSPEC_MAX_BATCH_SIZE)
  {{- if .Values.model.maxSeqLen }}
  - --context-length=$(DEEPSPEC_MAX_SEQ_LEN)
  {{- end }}
  - --enable-metrics
{{- else if eq $w.runtime "trtllm-serve" }}
image: {{ toYaml $w.openai.trtllmServe.image | nindent 2 }}
script: trtllm-serve.sh
metricsPath: /prometheus/metrics
args:
  - --host=0.0.0.0
  - --port={{ $port }}
  - --max_batch_size=$(DEEPSPEC_MAX_BATCH_SIZE)
  {{- if .Values.model.maxSeqLen }}
  - --max_seq_len=$(DEEPSPEC_MAX_SEQ_LEN)
  {{- end }}
{{- end }}
{{- end }}

{{/*
Port and path Prometheus scrapes on a worker pod: the engine's HTTP port (its metrics share the API port) or the
worker's own metrics port.
Usage: {{- $scrape := include "deepspec.worker.scrape" . | fromYaml }}
*/}}
{{- define "deepspec.worker.scrape" -}}
{{- if include "deepspec.openaiRuntime" . }}
port: {{ .Values.worker.openai.httpPort }}
path: {{ (include "deepspec.worker.engine" . | fromYaml).metricsPath }}
{{- else }}
port: {{ .Values.worker.metricsPort }}
path: /metrics
{{- end }}
{{- end }}

{{/*
Worker pod template, shared by the Deployment and the StatefulSet.
Usage: {{- include "deepspec.worker.podTemplate" . | nindent 4 }}
*/}}
{{- define "deepspec.worker.podTemplate" -}}
{{- $ctx := dict "ctx" . "component" "worker" }}
{{- $w := .Values.worker }}
{{- $triton := eq $w.runtime "triton" }}
{{- $openai := eq (include "deepspec.openaiRuntime" .) "true" }}
{{- $engine := include "deepspec.worker.engine" . | fromYaml }}
{{- $scrape := include "deepspec.worker.scrape" . | fromYaml }}
{{- $cuda := eq $w.device "cuda" }}
{{- $bundlesVolume := include "deepspec.worker.bundlesVolume" . }}
{{- $b := include "deepspec.worker.bundles" . | fromYaml }}
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
    {{- if include "deepspec.scrapeAnnotations" . }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $scrape.port | quote }}
    prometheus.io/path: {{ $scrape.path }}
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
  # preStop sleep + drain + 15 s: the kubelet's SIGKILL never lands inside a drain.
  terminationGracePeriodSeconds: {{ include "deepspec.gracePeriod" (dict "preStop" $w.preStopSleepSeconds "drain" $w.drainTimeoutSeconds) }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if eq $b.source "export" }}
  initContainers:
    # Exports the bundle once; with a per-replica volume a restarted pod finds the manifest and skips it.
    # python -m export writes a scratch dir beside --out and renames it at the end, so an interrupted export is
    # never mistaken for a done one (--force replaces a directory without a manifest; *.partial is an older chart's).
    - name: export-bundle
      image: {{ include "deepspec.workerImage" . }}
      imagePullPolicy: {{ $w.image.pullPolicy }}
      command: ["/bin/sh", "-ec"]
      args:
        - |
          out="{{ ternary "$(DEEPSPEC_TRITON_MODEL_REPOSITORY)" "$(DEEPSPEC_BUNDLE_DIR)" $triton }}"
          if [ -f "$out/manifest.json" ]; then
            echo "bundle already exported at $out"
            {{- if $openai }}
            # The launch script names the target's directory; an alias or GGUF target is dequantized into /cache,
            # which a new pod starts without: put it back where the script expects it.
            python -c 'import sys; from deepspec.models.target_loader import resolve_target_dir; resolve_target_dir(sys.argv[1])' "$DEEPSPEC_TARGET"
            {{- end }}
            exit 0
          fi
          rm -rf "$out.partial"
          python -m export --target "$DEEPSPEC_TARGET" --draft "$DEEPSPEC_DRAFT" \
            --format "$DEEPSPEC_EXPORT_FORMAT" --out "$out" --force {{- if $openai }} \
            --tp {{ int $w.openai.tensorParallel }} --num-speculative-tokens "$DEEPSPEC_NUM_SPECULATIVE_TOKENS" --dtype "$DEEPSPEC_DTYPE"
            {{- end }} {{- range $b.export.extraArgs }} {{ . | quote }}{{ end }}
      envFrom:
        - configMapRef:
            name: {{ $configMap }}
      env:
        {{- include "deepspec.scratchEnv" . | nindent 8 }}
        {{- with $w.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      resources:
        {{- include "deepspec.worker.resources" (dict "ctx" . "resources" $b.export.resources) | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: bundles
          mountPath: {{ $b.mountPath }}
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
      {{- $world := int (mul (int $w.triton.tensorParallel) (int $w.triton.pipelineParallel)) }}
      {{- $server := list "--model-repository=$(DEEPSPEC_TRITON_MODEL_REPOSITORY)" (printf "--http-port=%d" (int $w.triton.httpPort)) (printf "--grpc-port=%d" (int $w.grpcPort)) (printf "--metrics-port=%d" (int $w.metricsPort)) "--allow-metrics=true" "--exit-on-error=true" (printf "--exit-timeout-secs=%d" (int $w.drainTimeoutSeconds)) }}
      {{- if eq $world 1 }}
      command: ["tritonserver"]
      args:
        {{- toYaml $server | nindent 8 }}
        {{- with $w.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- else }}
      # One tritonserver per rank under mpirun (world size = tensorParallel x pipelineParallel), as TensorRT-LLM's
      # launch_triton_server.py --trtllm_llmapi_launch starts them: each through trtllm-llmapi-launch (the LLM-API
      # mode), rank 0 serves the API and builds the LLM over the MPI world, the others load only the tensorrt_llm
      # model, whose model.py turns them into rank 0's MPI workers; each rank has its own Python-backend shm prefix.
      # PID 1 is files/triton-ranks.sh: it runs mpirun and hands the pod's SIGTERM to the ranks, rank 0 first, so
      # tritonserver drains (mpirun alone would SIGKILL the ranks seconds after SIGTERM).
      command: ["sh", "-c", {{ .Files.Get "files/triton-ranks.sh" | toJson }}, "triton-ranks"]
      args:
        {{- range $rank := until $world }}
        - -n
        - "1"
        - trtllm-llmapi-launch
        - tritonserver
        {{- toYaml $server | nindent 8 }}
        - --disable-auto-complete-config
        - --backend-config=python,shm-region-prefix-name=prefix{{ $rank }}_
        {{- if gt $rank 0 }}
        - --model-control-mode=explicit
        - --load-model=tensorrt_llm
        {{- else }}
        {{- with $w.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- end }}
        {{- if lt $rank (sub $world 1) }}
        - ":"
        {{- end }}
        {{- end }}
      {{- end }}
      {{- else if $openai }}
      image: {{ include "deepspec.image" (dict "ctx" . "image" $engine.image) }}
      imagePullPolicy: {{ $engine.image.pullPolicy }}
      # The launch script python -m export wrote: it execs the engine with the target, the draft, tensor parallelism
      # and the speculative flags; the chart appends the pod's own flags (its "$@").
      command: ["sh", "$(DEEPSPEC_BUNDLE_DIR)/launch/{{ $engine.script }}"]
      args:
        {{- toYaml $engine.args | nindent 8 }}
        {{- with $w.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- else }}
      image: {{ include "deepspec.workerImage" . }}
      imagePullPolicy: {{ $w.image.pullPolicy }}
      command: ["python", "-m", "service", "worker"]
      # $(VAR) is expanded by Kubernetes from the ConfigMap below.
      args:
        {{- if eq $b.source "none" }}
        - --target=$(DEEPSPEC_TARGET)
        - --draft=$(DEEPSPEC_DRAFT)
        - --backend=$(DEEPSPEC_BACKEND)
        {{- end }}
        - --port={{ $w.grpcPort }}
        - --metrics-port={{ $w.metricsPort }}
        - --device=$(DEEPSPEC_DEVICE)
        - --dtype=$(DEEPSPEC_DTYPE)
        - --quantization=$(DEEPSPEC_QUANTIZATION)
        - --max-batch-size=$(DEEPSPEC_MAX_BATCH_SIZE)
        - --num-speculative-tokens=$(DEEPSPEC_NUM_SPECULATIVE_TOKENS)
        {{- if .Values.model.maxSeqLen }}
        - --max-seq-len=$(DEEPSPEC_MAX_SEQ_LEN)
        {{- end }}
        - --max-queue=$(DEEPSPEC_MAX_QUEUE)
        - --drain-timeout-s={{ $w.drainTimeoutSeconds }}
        {{- if ne $b.source "none" }}
        # Target and draft come from the bundle's manifest.json (flags would override it).
        - --bundle-dir=$(DEEPSPEC_BUNDLE_DIR)
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
        {{- if or $openai $triton }}
        # UID 10001 has no passwd entry in the engine and Triton images: getpass.getuser() (torch and Triton cache
        # paths, TensorRT-LLM's MPI session) reads these first instead of failing on the lookup.
        - name: USER
          value: deepspec
        - name: LOGNAME
          value: deepspec
        {{- end }}
        {{- if eq $w.runtime "vllm" }}
        - name: VLLM_NO_USAGE_STATS
          value: "1"
        {{- end }}
        {{- with $w.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      # Keep serving while endpoints and the gateways' discovery catch up with "terminating"; SIGTERM (drain) after.
      lifecycle:
        preStop:
          exec:
            command: ["sleep", "{{ $w.preStopSleepSeconds }}"]
      ports:
        {{- if $openai }}
        # One port: the OpenAI API, /health and the engine's Prometheus metrics.
        - name: http
          containerPort: {{ $w.openai.httpPort }}
          protocol: TCP
        {{- else }}
        - name: grpc
          containerPort: {{ $w.grpcPort }}
          protocol: TCP
        - name: metrics
          containerPort: {{ $w.metricsPort }}
          protocol: TCP
        {{- end }}
        {{- if $triton }}
        - name: http
          containerPort: {{ $w.triton.httpPort }}
          protocol: TCP
        {{- end }}
      # Model loads take minutes: the startup probe holds liveness off for up to startupBudgetSeconds.
      startupProbe:
        {{- if $openai }}
        httpGet:
          path: /health
          port: http
        {{- else if $triton }}
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
      # (the engines' /health: vLLM 503 once its engine core died, SGLang 503 while starting or draining, trtllm-serve
      # 503 when its executor is gone).
      readinessProbe:
        {{- if $openai }}
        httpGet:
          path: /health
          port: http
        {{- else if $triton }}
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
        {{- if $openai }}
        tcpSocket:
          port: http
        {{- else if $triton }}
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
        {{- if $bundlesVolume }}
        - name: bundles
          mountPath: {{ $b.mountPath }}
          readOnly: true
        {{- end }}
        - name: tmp
          mountPath: /tmp
        - name: {{ ternary "data" "cache" (and $perReplica (ne $b.source "export")) }}
          mountPath: /cache
        {{- if $w.shm.enabled }}
        - name: shm
          mountPath: /dev/shm
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 1Gi
    {{- if not (and $perReplica (ne $b.source "export")) }}
    - name: cache
      {{- if eq $w.modelCache.type "pvc" }}
      persistentVolumeClaim:
        claimName: {{ $w.modelCache.pvc.existingClaim | default (include "deepspec.componentName" (dict "ctx" . "component" "model-cache")) }}
      {{- else }}
      emptyDir:
        sizeLimit: {{ $w.modelCache.size }}
      {{- end }}
    {{- end }}
    {{- if $w.shm.enabled }}
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $w.shm.sizeLimit }}
    {{- end }}
    {{- if eq $b.source "pvc" }}
    - name: bundles
      persistentVolumeClaim:
        claimName: {{ $b.pvc.existingClaim | default (include "deepspec.componentName" (dict "ctx" . "component" "bundles")) }}
        readOnly: true
    {{- else if and (eq $b.source "export") (not $perReplica) }}
    - name: bundles
      emptyDir:
        sizeLimit: {{ $b.emptyDirSizeLimit }}
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
  {{- $affinity := deepCopy ($w.affinity | default dict) }}
  {{- if $w.gpu.architectures }}
  {{- /* Prebuilt TensorRT-LLM engines run only on the GPU architecture they were built for. */}}
  {{- $term := dict "matchExpressions" (list (dict "key" $w.gpu.architectureLabel "operator" "In" "values" $w.gpu.architectures)) }}
  {{- $_ := set $affinity "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" (list $term))) }}
  {{- end }}
  {{- with $affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  topologySpreadConstraints:
    {{- if $w.topologySpreadConstraints }}
    {{- toYaml $w.topologySpreadConstraints | nindent 4 }}
    {{- else }}
    {{- /* A node or a zone going away takes at most its share of the workers; ScheduleAnyway, because a GPU
           cluster rarely has a free GPU in every zone. matchLabelKeys: spread each revision on its own. */}}
    {{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
    - maxSkew: 1
      topologyKey: {{ $key }}
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "deepspec.selectorLabels" $ctx | nindent 10 }}
      matchLabelKeys: [{{ ternary "controller-revision-hash" "pod-template-hash" $perReplica }}]
    {{- end }}
    {{- end }}
{{- end }}
