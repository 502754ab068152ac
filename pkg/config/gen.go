package config

//go:generate go run gen_schema.go
