module github.com/gaptrace/gaptrace/tools/jaeger

go 1.26.8
