package chart

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	podutil "k8s.io/kubernetes/pkg/api/pod"
	"k8s.io/kubernetes/pkg/apis/apps"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	appsvalidation "k8s.io/kubernetes/pkg/apis/apps/validation"
	"k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/rbac"
	_ "k8s.io/kubernetes/pkg/apis/rbac/install"
	rbacvalidation "k8s.io/kubernetes/pkg/apis/rbac/validation"
	"k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	resourcevalidation "k8s.io/kubernetes/pkg/apis/resource/validation"
	"sigs.k8s.io/yaml"
)

// validate judges a rendered object as the API server does on create:
// defaulted, converted to the internal version and validated by
// Kubernetes v1.37.2's own validation. (test/e2e's helm install
// --dry-run=server does the same against a running API server.) ok is
// false for kinds it does not know: custom resources.
func validate(t *testing.T, o object, edit func(runtime.Object)) (errs field.ErrorList, ok bool) {
	t.Helper()
	var ext, in runtime.Object
	switch o.Kind {
	case "DaemonSet":
		ext, in = &appsv1.DaemonSet{}, &apps.DaemonSet{}
	case "ConfigMap":
		ext, in = &corev1.ConfigMap{}, &core.ConfigMap{}
	case "Service":
		ext, in = &corev1.Service{}, &core.Service{}
	case "ServiceAccount":
		ext, in = &corev1.ServiceAccount{}, &core.ServiceAccount{}
	case "ClusterRole":
		ext, in = &rbacv1.ClusterRole{}, &rbac.ClusterRole{}
	case "ClusterRoleBinding":
		ext, in = &rbacv1.ClusterRoleBinding{}, &rbac.ClusterRoleBinding{}
	case "Role":
		ext, in = &rbacv1.Role{}, &rbac.Role{}
	case "RoleBinding":
		ext, in = &rbacv1.RoleBinding{}, &rbac.RoleBinding{}
	case "DeviceClass":
		ext, in = &resourcev1.DeviceClass{}, &resource.DeviceClass{}
	default:
		return nil, false
	}
	if err := yaml.UnmarshalStrict(o.YAML, ext); err != nil {
		t.Fatalf("%s %s: %v", o.Kind, o.Name, err)
	}
	if edit != nil {
		edit(ext)
	}
	legacyscheme.Scheme.Default(ext)
	if err := legacyscheme.Scheme.Convert(ext, in, nil); err != nil {
		t.Fatalf("%s %s: convert: %v", o.Kind, o.Name, err)
	}
	switch x := in.(type) {
	case *apps.DaemonSet:
		return appsvalidation.ValidateDaemonSet(x, podutil.GetValidationOptionsFromPodTemplate(&x.Spec.Template, nil)), true
	case *core.ConfigMap:
		return corevalidation.ValidateConfigMap(x), true
	case *core.Service:
		return corevalidation.ValidateServiceCreate(x), true
	case *core.ServiceAccount:
		return corevalidation.ValidateServiceAccount(x), true
	case *rbac.ClusterRole:
		return rbacvalidation.ValidateClusterRole(x, rbacvalidation.ClusterRoleValidationOptions{}), true
	case *rbac.ClusterRoleBinding:
		return rbacvalidation.ValidateClusterRoleBinding(x), true
	case *rbac.Role:
		return rbacvalidation.ValidateRole(x), true
	case *rbac.RoleBinding:
		return rbacvalidation.ValidateRoleBinding(x), true
	case *resource.DeviceClass:
		return resourcevalidation.ValidateDeviceClass(x), true
	}
	panic("unreachable")
}

// TestObjectsValid: every object of every value set is one the API
// server accepts.
func TestObjectsValid(t *testing.T) {
	custom := map[string]bool{"ServiceMonitor": true, "NetworkAttachmentDefinition": true, "CustomResourceDefinition": true}
	for name, vs := range valueSets {
		t.Run(name, func(t *testing.T) {
			r := render(t, Options{Values: values(t, vs), APIVersions: []string{serviceMonitorAPI, nadAPI}, IncludeCRDs: true})
			for _, o := range objects(t, r) {
				errs, ok := validate(t, o, nil)
				if !ok && !custom[o.Kind] {
					t.Errorf("%s %s: a kind this test cannot validate", o.Kind, o.Name)
				}
				for _, e := range errs {
					t.Errorf("%s %s: %v", o.Kind, o.Name, e)
				}
			}
		})
	}
}

// TestObjectsValidControl: the validation is Kubernetes' own and live: a
// DaemonSet with a Bidirectional mount in its unprivileged container, or
// allowPrivilegeEscalation false next to CAP_SYS_ADMIN, is refused.
func TestObjectsValidControl(t *testing.T) {
	ds := find(objects(t, render(t, Options{})), "DaemonSet")[0]
	for _, tc := range []struct {
		name string
		edit func(*corev1.Container)
		want string
	}{
		{"Bidirectional", func(c *corev1.Container) {
			b := corev1.MountPropagationBidirectional
			c.VolumeMounts[len(c.VolumeMounts)-1].MountPropagation = &b
		}, "Bidirectional mount propagation is available only to privileged containers"},
		{"CAP_SYS_ADMIN", func(c *corev1.Container) {
			c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, "CAP_SYS_ADMIN")
		}, "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := validate(t, ds, func(o runtime.Object) {
				tc.edit(&o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0])
			})
			if !strings.Contains(errs.ToAggregate().Error(), tc.want) {
				t.Errorf("validation errors %v, want %q", errs, tc.want)
			}
		})
	}
}
