module github.com/kvtop/kvtop

go 1.26
