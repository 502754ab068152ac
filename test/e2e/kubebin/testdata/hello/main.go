// Command hello is the program kubebin's tests build.
package main

import "fmt"

func main() { fmt.Println("hello") }
