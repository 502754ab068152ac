package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of xdpq's resources.
const GroupName = "xdpq.io"

// SchemeGroupVersion is this package's group and version.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource is the XdpqNode resource's group, version and plural name, as
// dynamic clients and discovery name it.
var Resource = SchemeGroupVersion.WithResource("xdpqnodes")

// Kind is the XdpqNode's kind.
const Kind = "XdpqNode"

// AddToScheme adds this package's types to a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &XdpqNode{}, &XdpqNodeList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
