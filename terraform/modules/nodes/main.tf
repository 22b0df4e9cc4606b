# Controllers and brokers of one Strata cluster on NVMe instances (i4i / i3en) across three
# availability zones. Each node has a fixed network interface, so its address is known before
# it boots (the controllers' voter list and the brokers' controller list are rendered into the
# configs) and survives a replacement of the instance. Node i is placed in subnet i % 3; a
# broker's [cluster] rack is its zone, so rack-aware placement puts the three replicas of a
# partition in three zones.
#
# At first boot cloud-init writes /etc/strata/strata.toml (templates/*.toml.tftpl, with
# Strata's own config fields), the repository's systemd unit (deploy/strata.service) with a
# drop-in that makes it wait for the NVMe file system, the unit and script that mount it, and
# an install script; it installs the strata binary (checked against its SHA-256) and starts
# `strata server --config /etc/strata/strata.toml`.
#
# Security groups: the Kafka listener is the only port clients reach (client_cidr_blocks,
# client_security_group_ids); the controller, replication and metrics ports are open only
# between members of the cluster's own group (metrics also to monitoring_security_group_ids).

data "aws_region" "current" {}

data "aws_subnet" "zone" {
  count = 3
  id    = var.subnet_ids[count.index]
}

data "aws_ssm_parameter" "al2023" {
  count = var.ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

locals {
  ami      = var.ami_id != null ? var.ami_id : nonsensitive(data.aws_ssm_parameter.al2023[0].value)
  zones    = [for s in data.aws_subnet.zone : s.availability_zone]
  data_dir = "/var/lib/strata/data"

  controller_addresses = [for eni in aws_network_interface.controller : "${eni.private_ip}:${var.controller_port}"]
  voters               = { for i, address in local.controller_addresses : tostring(i + 1) => address }
  broker_endpoints     = [for eni in aws_network_interface.broker : "${eni.private_ip}:${var.kafka_port}"]

  controller_configs = [for i in range(var.controller_count) : templatefile("${path.module}/templates/controller.toml.tftpl", {
    cluster_name    = var.cluster_name
    node_id         = i + 1
    rack            = local.zones[i % 3]
    data_dir        = local.data_dir
    metrics_port    = var.metrics_port
    controller_port = var.controller_port
    voters          = local.voters
  })]

  broker_configs = [for i in range(var.broker_count) : templatefile("${path.module}/templates/broker.toml.tftpl", {
    cluster_name    = var.cluster_name
    node_id         = i + 1
    rack            = local.zones[i % 3]
    data_dir        = local.data_dir
    kafka_port      = var.kafka_port
    advertised_host = aws_network_interface.broker[i].private_ip
    grpc_port       = var.grpc_port
    metrics_port    = var.metrics_port
    controllers     = local.controller_addresses
    cluster_id      = var.cluster_id
    cold_url        = var.cold_url
    region          = data.aws_region.current.name
  })]

  # cloud-init: the config, the units and scripts, then install and start.
  cloud_init = { for role, configs in { controller = local.controller_configs, broker = local.broker_configs } :
    role => [for config in configs : join("\n", ["#cloud-config", yamlencode({
      packages = ["mdadm", "xfsprogs", "curl"]
      write_files = [
        { path = "/etc/strata/strata.toml", owner = "root:root", permissions = "0644", content = config },
        { path = "/etc/systemd/system/strata.service", owner = "root:root", permissions = "0644", content = file("${path.module}/../../../deploy/strata.service") },
        { path = "/etc/systemd/system/strata.service.d/10-instance-store.conf", owner = "root:root", permissions = "0644", content = file("${path.module}/templates/strata-instance-store.conf") },
        { path = "/etc/systemd/system/strata-disk.service", owner = "root:root", permissions = "0644", content = file("${path.module}/templates/strata-disk.service") },
        { path = "/usr/local/sbin/strata-prepare-disk", owner = "root:root", permissions = "0755", content = file("${path.module}/templates/strata-prepare-disk.sh") },
        { path = "/usr/local/sbin/strata-install", owner = "root:root", permissions = "0755", content = file("${path.module}/templates/strata-install.sh") },
      ]
      runcmd = [
        ["/usr/local/sbin/strata-install", var.strata_binary_url, var.strata_binary_sha256],
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "strata-disk.service", "strata.service"],
      ]
    })])]
  }
}

# --- security groups ---------------------------------------------------------------------

resource "aws_security_group" "cluster" {
  name        = "${var.cluster_name}-strata-cluster"
  description = "Strata ${var.cluster_name}: every node; internal ports open between members only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.cluster_name}-strata-cluster" })
}

resource "aws_security_group" "kafka_clients" {
  name        = "${var.cluster_name}-strata-kafka"
  description = "Strata ${var.cluster_name} brokers: the Kafka listener, for clients"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.cluster_name}-strata-kafka" })
}

locals {
  internal_ports = {
    controller = { port = var.controller_port, what = "Raft between controllers, the controller API for brokers" }
    grpc       = { port = var.grpc_port, what = "replication between brokers (gRPC data plane)" }
    metrics    = { port = var.metrics_port, what = "metrics and health probes" }
  }
}

resource "aws_vpc_security_group_ingress_rule" "internal" {
  for_each                     = local.internal_ports
  security_group_id            = aws_security_group.cluster.id
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "tcp"
  from_port                    = each.value.port
  to_port                      = each.value.port
  description                  = "${each.value.what}, from the cluster's own nodes"
}

resource "aws_vpc_security_group_egress_rule" "internal" {
  for_each                     = local.internal_ports
  security_group_id            = aws_security_group.cluster.id
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "tcp"
  from_port                    = each.value.port
  to_port                      = each.value.port
  description                  = "${each.value.what}, to the cluster's own nodes"
}

resource "aws_vpc_security_group_egress_rule" "https" {
  security_group_id = aws_security_group.cluster.id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  description       = "HTTPS out: S3, KMS, SSM, the OS packages and the strata binary"
}

resource "aws_vpc_security_group_ingress_rule" "kafka_from_cidrs" {
  for_each          = toset(var.client_cidr_blocks)
  security_group_id = aws_security_group.kafka_clients.id
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.kafka_port
  to_port           = var.kafka_port
  description       = "Kafka clients in ${each.value}"
}

resource "aws_vpc_security_group_ingress_rule" "kafka_from_groups" {
  for_each                     = toset(var.client_security_group_ids)
  security_group_id            = aws_security_group.kafka_clients.id
  referenced_security_group_id = each.value
  ip_protocol                  = "tcp"
  from_port                    = var.kafka_port
  to_port                      = var.kafka_port
  description                  = "Kafka clients in ${each.value}"
}

resource "aws_vpc_security_group_ingress_rule" "metrics_from_monitoring" {
  for_each                     = toset(var.monitoring_security_group_ids)
  security_group_id            = aws_security_group.cluster.id
  referenced_security_group_id = each.value
  ip_protocol                  = "tcp"
  from_port                    = var.metrics_port
  to_port                      = var.metrics_port
  description                  = "Prometheus scrapers in ${each.value}"
}

# --- network interfaces: fixed addresses -------------------------------------------------

resource "aws_network_interface" "controller" {
  count           = var.controller_count
  subnet_id       = var.subnet_ids[count.index % 3]
  security_groups = [aws_security_group.cluster.id]
  description     = "${var.cluster_name} strata controller ${count.index + 1}"
  tags            = merge(var.tags, { Name = "${var.cluster_name}-strata-controller-${count.index + 1}" })
}

resource "aws_network_interface" "broker" {
  count           = var.broker_count
  subnet_id       = var.subnet_ids[count.index % 3]
  security_groups = [aws_security_group.cluster.id, aws_security_group.kafka_clients.id]
  description     = "${var.cluster_name} strata broker ${count.index + 1}"
  tags            = merge(var.tags, { Name = "${var.cluster_name}-strata-broker-${count.index + 1}" })
}

# --- instances ---------------------------------------------------------------------------

resource "aws_instance" "controller" {
  count                = var.controller_count
  ami                  = local.ami
  instance_type        = var.controller_instance_type
  iam_instance_profile = var.controller_instance_profile
  user_data            = local.cloud_init.controller[count.index]
  monitoring           = true
  ebs_optimized        = true

  network_interface {
    network_interface_id = aws_network_interface.controller[count.index].id
    device_index         = 0
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    encrypted   = true
    volume_type = "gp3"
    volume_size = var.root_volume_gb
  }

  tags = merge(var.tags, {
    Name          = "${var.cluster_name}-strata-controller-${count.index + 1}"
    "strata:role" = "controller"
    "strata:zone" = local.zones[count.index % 3]
    "strata:node" = tostring(count.index + 1)
  })

  lifecycle {
    # A changed config or AMI must not stop the instance (its instance store would be wiped):
    # roll nodes one at a time with `terraform apply -replace=...`.
    ignore_changes = [ami, user_data]

    precondition {
      condition     = length(distinct(local.zones)) == 3
      error_message = "The three subnets must be in three different availability zones."
    }
  }
}

resource "aws_instance" "broker" {
  count                = var.broker_count
  ami                  = local.ami
  instance_type        = var.broker_instance_type
  iam_instance_profile = var.broker_instance_profile
  user_data            = local.cloud_init.broker[count.index]
  monitoring           = true
  ebs_optimized        = true

  network_interface {
    network_interface_id = aws_network_interface.broker[count.index].id
    device_index         = 0
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    encrypted   = true
    volume_type = "gp3"
    volume_size = var.root_volume_gb
  }

  tags = merge(var.tags, {
    Name          = "${var.cluster_name}-strata-broker-${count.index + 1}"
    "strata:role" = "broker"
    "strata:zone" = local.zones[count.index % 3]
    "strata:node" = tostring(count.index + 1)
  })

  lifecycle {
    ignore_changes = [ami, user_data]

    precondition {
      condition     = length(distinct(local.zones)) == 3
      error_message = "The three subnets must be in three different availability zones."
    }
  }

  # The controllers first: a broker registers with them as it starts.
  depends_on = [aws_instance.controller]
}
