package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/dynrunner/dynrunner/internal/testbed/testproc"
)

// Versions of the control plane, kept in step with scripts/k8s-tools.sh.
const (
	KubeVersion = "v1.36.3"
	EtcdVersion = "v3.6.16"
)

// ToolsCommand builds the binaries Start runs.
const ToolsCommand = "bash scripts/k8s-tools.sh all"

// Users of the static token file.
const (
	// AdminUser is in system:masters: Cluster.Config and Cluster.Client act as it.
	AdminUser = "kubetest-admin"
	// User has no permissions until a test binds a Role to it (UserConfig).
	User = "kubetest-user"
)

// Bounds of the start-up.
const (
	etcdReadyTimeout      = 30 * time.Second
	apiserverReadyTimeout = 2 * time.Minute
	startAttempts         = 3
)

// Cluster is a running etcd and kube-apiserver. Start returns it; the test's cleanup stops
// both.
type Cluster struct {
	// Config is the admin's client configuration (bearer token, verified TLS).
	Config *rest.Config
	// Client is a clientset over Config.
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file for the admin (for kubectl, or a controller
	// under test that reads KUBECONFIG).
	Kubeconfig string
	// UserKubeconfig is the path of a kubeconfig file for User (UserConfig), for a process
	// under test that must run with only the permissions the test binds.
	UserKubeconfig string
	// Dir holds the cluster's files: etcd's data, certificates, logs.
	Dir string

	ca        *ca
	userToken string
	etcd      *testproc.Process
	apiserver *testproc.Process
}

// Binaries returns the paths of kube-apiserver and etcd: $KUBE_APISERVER_BIN and $ETCD_BIN when
// set, else the cache scripts/k8s-tools.sh fills ($DYNRUNNER_CACHE or $HOME/.cache/dynrunner,
// tools/kube-apiserver-<version> and tools/etcd-<version>). It checks that both exist.
func Binaries() (apiserver, etcd string, err error) {
	root, err := cacheRoot()
	if err != nil {
		return "", "", err
	}
	apiserver = os.Getenv("KUBE_APISERVER_BIN")
	if apiserver == "" {
		apiserver = filepath.Join(root, "tools", "kube-apiserver-"+KubeVersion, "kube-apiserver")
	}
	etcd = os.Getenv("ETCD_BIN")
	if etcd == "" {
		etcd = filepath.Join(root, "tools", "etcd-"+EtcdVersion, "etcd")
	}
	for _, bin := range []string{apiserver, etcd} {
		fi, err := os.Stat(bin)
		if err != nil {
			return "", "", fmt.Errorf("kubetest: %w", err)
		}
		if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return "", "", fmt.Errorf("kubetest: %s is not an executable file", bin)
		}
	}
	return apiserver, etcd, nil
}

// cacheRoot is the cache scripts/k8s-tools.sh fills: $DYNRUNNER_CACHE, else
// $HOME/.cache/dynrunner.
func cacheRoot() (string, error) {
	if root := os.Getenv("DYNRUNNER_CACHE"); root != "" {
		return root, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("kubetest: locate cache: %w", err)
	}
	return filepath.Join(home, ".cache", "dynrunner"), nil
}

// Start runs etcd and kube-apiserver on free loopback ports with their files in a temporary
// directory and returns once /readyz answers ok. The test's cleanup stops both. It skips the
// test (fails it when the environment variable CI is set) when the binaries are missing, and
// skips it with -short.
func Start(t *testing.T) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("kubetest: starts etcd and kube-apiserver; run without -short")
	}
	apiserverBin, etcdBin, err := Binaries()
	if err != nil {
		msg := fmt.Sprintf("%v; build kube-apiserver %s and etcd %s with `%s` (6 to 12 minutes on two cores, once)",
			err, KubeVersion, EtcdVersion, ToolsCommand)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	began := time.Now()
	c := &Cluster{Dir: t.TempDir()}
	t.Cleanup(c.stop)
	if err := c.prepare(); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	for attempt := 1; ; attempt++ {
		err = c.launch(t.Context(), apiserverBin, etcdBin)
		if err == nil {
			break
		}
		c.stop()
		if !errors.Is(err, testproc.ErrPortTaken) || attempt == startAttempts {
			t.Fatalf("kubetest: %v", err)
		}
	}
	if err := c.bootstrap(t.Context()); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Logf("kubetest: kube-apiserver %s ready at %s in %v", KubeVersion, c.Config.Host, time.Since(began).Round(time.Millisecond))
	return c
}

// prepare writes the certificates, keys and the token file.
func (c *Cluster) prepare() error {
	var err error
	if c.ca, err = newCA(); err != nil {
		return err
	}
	files := map[string][]byte{"ca.crt": c.ca.pem}
	for _, leaf := range []struct {
		name   string
		cn     string
		server bool
	}{{"apiserver", "kube-apiserver", true}, {"kubelet-client", "kube-apiserver-kubelet-client", false}} {
		cert, key, err := c.ca.issue(leaf.cn, leaf.server)
		if err != nil {
			return err
		}
		files[leaf.name+".crt"], files[leaf.name+".key"] = cert, key
	}
	admin, user := randomToken(), randomToken()
	c.userToken = user
	files["tokens.csv"] = fmt.Appendf(nil, "%s,%s,%s,\"system:masters\"\n%s,%s,%s,\"kubetest-users\"\n",
		admin, AdminUser, AdminUser, user, User, User)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(c.Dir, name), data, 0o600); err != nil {
			return err
		}
	}
	if err := writeKeyPair(filepath.Join(c.Dir, "sa.key"), filepath.Join(c.Dir, "sa.pub")); err != nil {
		return err
	}
	c.Config = &rest.Config{
		BearerToken:     admin,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.ca.pem},
		QPS:             200,
		Burst:           400,
	}
	return nil
}

// launch starts etcd and kube-apiserver on new ports and waits until both are ready.
func (c *Cluster) launch(ctx context.Context, apiserverBin, etcdBin string) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.etcd, err = testproc.Start("etcd", filepath.Join(c.Dir, "etcd.log"), etcdBin,
		"--name=default",
		"--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	if err := c.etcd.WaitReady(ctx, etcdReadyTimeout, func(ctx context.Context) error {
		return httpOK(ctx, http.DefaultClient, etcdURL+"/health", "")
	}); err != nil {
		return err
	}
	host := "https://127.0.0.1:" + strconv.Itoa(ports[2])
	f := func(name string) string { return filepath.Join(c.Dir, name) }
	c.apiserver, err = testproc.Start("kube-apiserver", f("kube-apiserver.log"), apiserverBin,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[2]),
		"--cert-dir="+f("certs"),
		"--tls-cert-file="+f("apiserver.crt"),
		"--tls-private-key-file="+f("apiserver.key"),
		"--client-ca-file="+f("ca.crt"),
		"--token-auth-file="+f("tokens.csv"),
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+f("sa.pub"),
		"--service-account-signing-key-file="+f("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--kubelet-certificate-authority="+f("ca.crt"),
		"--kubelet-client-certificate="+f("kubelet-client.crt"),
		"--kubelet-client-key="+f("kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	c.Config.Host = host
	hc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	return c.apiserver.WaitReady(ctx, apiserverReadyTimeout, func(ctx context.Context) error {
		return httpOK(ctx, hc, host+"/readyz", "ok")
	})
}

// bootstrap builds the clients, writes the kubeconfig and creates the default namespace's
// ServiceAccount (no controller-manager runs to create it, and the ServiceAccount admission
// plugin refuses Pods without it).
func (c *Cluster) bootstrap(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	c.Client = client
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.ca.pem}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.Config.BearerToken}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "admin", Namespace: metav1.NamespaceDefault}
	kc.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*kc, c.Kubeconfig); err != nil {
		return err
	}
	c.UserKubeconfig = filepath.Join(c.Dir, "kubeconfig-user")
	kc.AuthInfos = map[string]*clientcmdapi.AuthInfo{"user": {Token: c.userToken}}
	kc.Contexts["kubetest"].AuthInfo = "user"
	if err := clientcmd.WriteToFile(*kc, c.UserKubeconfig); err != nil {
		return err
	}
	return createDefaultServiceAccount(ctx, client, metav1.NamespaceDefault)
}

// stop stops the apiserver, then etcd. It is idempotent.
func (c *Cluster) stop() {
	if c.apiserver != nil {
		c.apiserver.Stop()
	}
	if c.etcd != nil {
		c.etcd.Stop()
	}
}

// UserConfig returns a client configuration for User, who may do nothing until the test binds
// a Role or ClusterRole to it (or to the group "kubetest-users").
func (c *Cluster) UserConfig() *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.BearerToken = c.userToken
	return cfg
}

// Namespace creates a namespace of its own for the test, with its default ServiceAccount. No
// namespace controller runs, so it is not deleted; the cluster goes away with the test.
func (c *Cluster) Namespace(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	name := "kubetest-" + randomToken()[:10]
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create namespace %s: %v", name, err)
	}
	if err := createDefaultServiceAccount(ctx, c.Client, name); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return name
}

func createDefaultServiceAccount(ctx context.Context, client kubernetes.Interface, ns string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	_, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service account %s/default: %w", ns, err)
	}
	return nil
}

// httpOK checks that GET url answers 200 (with body want, when not empty).
func httpOK(ctx context.Context, hc *http.Client, url, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body [512]byte
	n, _ := resp.Body.Read(body[:])
	if resp.StatusCode != http.StatusOK || (want != "" && strings.TrimSpace(string(body[:n])) != want) {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body[:n])
	}
	return nil
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tlsConfigFor is the server side of the kubelet's TLS: its certificate from the cluster's CA,
// and client certificates required and verified against that CA.
func (c *Cluster) tlsConfigFor(cn string) (*tls.Config, error) {
	cert, err := c.ca.issueTLS(cn, true)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    c.ca.pool(),
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// BindUserRoles creates each Role of roles (by name) in ns, binds it to User, waits until the
// apiserver's authorizer applies every rule (it learns of bindings through informers, a moment
// after the creates returned) and returns a client acting as User.
func (c *Cluster) BindUserRoles(t *testing.T, ns string, roles map[string][]rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	for name, rules := range roles {
		if _, err := c.Client.RbacV1().Roles(ns).Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: User}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	user := kubernetes.NewForConfigOrDie(c.UserConfig())
	allowed := func(rule rbacv1.PolicyRule) bool {
		review, err := user.AuthorizationV1().SelfSubjectAccessReviews().Create(t.Context(), &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: rule.Verbs[0], Group: rule.APIGroups[0], Resource: rule.Resources[0],
			}},
		}, metav1.CreateOptions{})
		return err == nil && review.Status.Allowed
	}
	deadline := time.Now().Add(30 * time.Second)
	for name, rules := range roles {
		for _, rule := range rules {
			for !allowed(rule) {
				if time.Now().After(deadline) {
					t.Fatalf("kubetest: Role %s is not in effect for %s after 30s (%v)", name, User, rule)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return user
}
