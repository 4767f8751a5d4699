{{/*
Labels on every object: app.kubernetes.io/name (what manifests/ sets, and the pods' selector) plus Helm's.
*/}}
{{- define "claimwarden.labels" -}}
app.kubernetes.io/name: claimwarden
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
The image: repository@digest when a digest is given, else repository:tag (the tag defaults to appVersion).
*/}}
{{- define "claimwarden.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
The objects of one file of manifests/ (charts/claimwarden/files links to them, so that the chart and the
kustomize install share one source) as a JSON list: namespaced objects and ServiceAccount subjects moved to the
release namespace, the chart's labels added. Call with (dict "root" $ "file" "files/x.yaml") and read the result
with fromJsonArray; templates change what values change, then write each object with toYaml.
*/}}
{{- define "claimwarden.load" -}}
{{- $root := .root }}
{{- $objects := list }}
{{- range $doc := regexSplit "(?m)^---\\s*$" ($root.Files.Get .file) -1 }}
{{- $obj := fromYaml $doc }}
{{- if $obj.kind }}
{{- $_ := set $obj.metadata "labels" (merge (include "claimwarden.labels" $root | fromYaml) (default dict $obj.metadata.labels)) }}
{{- if $obj.metadata.namespace }}
{{- $_ := set $obj.metadata "namespace" $root.Release.Namespace }}
{{- end }}
{{- range $subject := default list $obj.subjects }}
{{- if eq $subject.kind "ServiceAccount" }}
{{- $_ := set $subject "namespace" $root.Release.Namespace }}
{{- end }}
{{- end }}
{{- $objects = append $objects $obj }}
{{- end }}
{{- end }}
{{- toJson $objects }}
{{- end }}

{{/*
A CEL list of strings as manifests/ writes it: ['a', 'b'].
*/}}
{{- define "claimwarden.celStrings" -}}
[{{ range $i, $s := . }}{{ if $i }}, {{ end }}'{{ $s }}'{{ end }}]
{{- end }}

{{/*
The port of a URL such as run.liveness (http://0.0.0.0:8080/healthz) or run.readiness.
*/}}
{{- define "claimwarden.urlPort" -}}
{{- $host := (urlParse .).host }}
{{- if not (contains ":" $host) }}{{ fail (printf "run.liveness or run.readiness %q names no port" .) }}{{ end }}
{{- last (splitList ":" $host) }}
{{- end }}

{{/*
A ValidatingAdmissionPolicy file of manifests/ (and its binding), with the CEL string lists of .variables
(name -> list of strings) replacing the policy's variables of those names.
*/}}
{{- define "claimwarden.policy" -}}
{{- $lists := .variables }}
{{- range $obj := include "claimwarden.load" (dict "root" .root "file" .file) | fromJsonArray }}
{{- if eq $obj.kind "ValidatingAdmissionPolicy" }}
{{- range $variable := $obj.spec.variables }}
{{- if hasKey $lists $variable.name }}
{{- $_ := set $variable "expression" (include "claimwarden.celStrings" (get $lists $variable.name)) }}
{{- end }}
{{- end }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
