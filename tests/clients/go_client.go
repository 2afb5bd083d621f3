// A Go client the end-to-end tests run through wiretape: `go_client BASE_URL`.
//
// net/http's default transport reads HTTPS_PROXY (but never for localhost or loopback
// addresses) and, on Linux, trusts the CAs in SSL_CERT_FILE.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

func main() {
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello from Go"}]}`
	url := os.Args[1] + "/v1/chat/completions"
	answer, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_client:", err)
		os.Exit(1)
	}
	defer answer.Body.Close()
	data, err := io.ReadAll(answer.Body)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_client:", err)
		os.Exit(1)
	}
	fmt.Println(answer.StatusCode, string(data))
}
